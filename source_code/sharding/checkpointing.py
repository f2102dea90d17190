"""Sharded checkpoints with torch.distributed.checkpoint (DCP), switched in atomically.

DCP writes one file per rank (its shards) plus a ``.metadata`` file that records which piece of
which global tensor lies where; loading into a model sharded over a *different* number of
ranks reads, on each rank, exactly the pieces its new shards need (resharding on load).

Layout of a checkpoint directory ``DIR``:

    DIR/step-00000032/      a complete DCP checkpoint (__0_0.distcp, __1_0.distcp, .metadata)
                            + progress.json (step, world size, model config)
    DIR/latest              the name of the newest complete one, e.g. "step-00000032"

Saving writes into ``DIR/step-XXXXXXXX.partial-<id>``, waits for every rank, renames it to its
final name and only then rewrites ``latest`` atomically (temporary file + fsync + os.replace):
a kill at any moment leaves ``latest`` naming a complete checkpoint. Older checkpoints and
leftovers of killed saves are removed after the switch.

A damaged checkpoint (``.metadata`` missing or unreadable, a ``.distcp`` file missing or shorter
than ``.metadata`` says, e.g. a copy cut short) is found by ``verify`` before any process group
exists; what only loading can find (corrupt bytes) is caught around ``dcp.load``. Either way
every rank raises the same one-line CheckpointMismatch (exit status 2, printed once by rank 0),
and the checkpoint is left as it is.

    torchrun --standalone --nproc-per-node=2 -m source_code.sharding.train --checkpoint ckpt
    torchrun --standalone --nproc-per-node=4 -m source_code.sharding.train --checkpoint ckpt --resume
"""
from __future__ import annotations

import json
import os
import pickle
import shutil
import uuid

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_state_dict, set_state_dict)

from source_code.checkpoint import _fsync_dir, CheckpointMismatch

LATEST = "latest"


def latest(directory) -> str | None:
    """Path of the newest complete checkpoint under ``directory``, or None."""
    pointer = os.path.join(os.fspath(directory), LATEST)
    if not os.path.exists(pointer):
        return None
    with open(pointer) as f:
        return os.path.join(os.fspath(directory), f.read().strip())


def read_progress(directory) -> dict | None:
    """progress.json of the newest checkpoint (no process group needed), or None."""
    path = latest(directory)
    if path is None:
        return None
    try:
        with open(os.path.join(path, "progress.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        raise CheckpointMismatch(f"error: {path} has no readable progress.json; point "
                                 "--checkpoint at a directory written by this script") from None


def _damaged(path: str, what: str) -> CheckpointMismatch:
    return CheckpointMismatch(
        f"error: the sharded checkpoint {path} is damaged ({what}); restore it (or its directory) "
        "from a copy, or run without --resume to train from scratch")


def verify(directory) -> str:
    """The newest checkpoint's path if its files are all there and as long as its .metadata
    says; else CheckpointMismatch naming the first damage found. Reads files only (no process
    group): every rank reaches the same verdict on a shared file system."""
    from torch.distributed.checkpoint import FileSystemReader
    path = latest(directory)
    if path is None or not os.path.isdir(path):
        raise CheckpointMismatch(f"error: {os.fspath(directory)}/{LATEST} names no checkpoint "
                                 "directory; point --checkpoint at one written by this script")
    if not os.path.exists(os.path.join(path, ".metadata")):
        raise _damaged(path, ".metadata is missing")
    try:
        metadata = FileSystemReader(path).read_metadata()
    except Exception as exc:  # pickle or I/O errors of any kind: the file is not DCP metadata
        raise _damaged(path, f".metadata is unreadable: {type(exc).__name__}") from None
    needed: dict[str, int] = {}                       # file -> bytes .metadata expects in it
    for info in metadata.storage_data.values():
        end = info.offset + info.length
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), end)
    for name, size in sorted(needed.items()):
        file = os.path.join(path, name)
        if not os.path.exists(file):
            raise _damaged(path, f"{name} is missing")
        have = os.path.getsize(file)
        if have < size:
            raise _damaged(path, f"{name} holds {have:,d} of the {size:,d} bytes .metadata "
                                 "lists: truncated")
    return path


def _write_pointer(directory: str, name: str) -> None:
    tmp = os.path.join(directory, f".{LATEST}.{uuid.uuid4().hex}.tmp")
    with open(tmp, "w") as f:
        f.write(name + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(directory, LATEST))   # atomic: old name or new name
    _fsync_dir(directory)


def save(directory, model, optimizer, progress: dict) -> str:
    """Collective: every rank writes its shards; returns the new checkpoint's path."""
    directory = os.fspath(directory)
    name = f"step-{progress['step']:08d}"
    token = [uuid.uuid4().hex[:8] if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(token, src=0)            # one partial directory for all ranks
    partial = os.path.join(directory, f"{name}.partial-{token[0]}")
    model_sd, optim_sd = get_state_dict(model, optimizer)  # sharded (DTensor) state dicts
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=partial)
    if dist.get_rank() == 0:
        with open(os.path.join(partial, "progress.json"), "w") as f:
            json.dump(progress, f)
        final = os.path.join(directory, name)
        if os.path.exists(final):
            shutil.rmtree(final)
        os.replace(partial, final)                      # the directory is complete: name it
        _fsync_dir(directory)
        _write_pointer(directory, name)                 # now `latest` points at it
        for entry in os.listdir(directory):             # older checkpoints, killed saves
            if entry.startswith("step-") and entry != name:
                shutil.rmtree(os.path.join(directory, entry), ignore_errors=True)
    dist.barrier()
    return os.path.join(directory, name)


def load(directory, model, optimizer) -> dict:
    """Collective: load the newest checkpoint into the (sharded) model and optimizer.

    Works whatever the number of ranks that saved it: DCP reads the pieces each rank needs.
    """
    path = latest(directory)
    if path is None:
        raise CheckpointMismatch(f"error: no checkpoint under {directory}; start without --resume")
    verify(directory)                                   # missing or short files: one line
    model_sd, optim_sd = get_state_dict(model, optimizer)  # the target layout of this run
    state = {"model": model_sd, "optim": optim_sd}
    problem = None
    try:
        dcp.load(state, checkpoint_id=path)
        set_state_dict(model, optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
    except (Exception, CheckpointException) as exc:  # DCP gathers every rank's failure into a
        problem = _summary(exc)                         # CheckpointException (a BaseException)
    problems = [None] * dist.get_world_size()
    dist.all_gather_object(problems, problem)           # all ranks agree, even if one failed alone
    first = next((p for p in problems if p), None)
    if first:
        raise _damaged(path, f"loading failed: {first}")
    return read_progress(directory)


def _summary(exc: BaseException) -> str:
    """'ExcType on rank R: first line' of the first rank's failure in a DCP CheckpointException."""
    where = ""
    if isinstance(exc, CheckpointException) and exc.failures:
        rank = min(exc.failures)
        exc, where = exc.failures[rank][0], f" on rank {rank}"  # (exception, stack) per rank
    if isinstance(exc, pickle.UnpicklingError):
        return f"{type(exc).__name__}{where}: a .distcp file holds bytes that are not tensor data"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}{where}" + (f": {text[0][:120]}" if text else "")


def full_model_state(model) -> dict:
    """The unsharded state dict on rank 0 (CPU tensors, for inference or export); {} elsewhere."""
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                cpu_offload=True))


def full_optimizer_state(model, optimizer) -> dict:
    """The unsharded optimizer state dict (keyed by parameter name) on rank 0; {} elsewhere."""
    _, optim_sd = get_state_dict(model, optimizer, options=StateDictOptions(
        full_state_dict=True, cpu_offload=True))
    return optim_sd


def export(path, model, optimizer=None) -> None:
    """Collective: rank 0 writes the full state dicts with torch.save (atomically)."""
    from source_code.checkpoint import atomic_save
    obj = {"model": full_model_state(model)}
    if optimizer is not None:
        obj["optim"] = full_optimizer_state(model, optimizer)
    if dist.get_rank() == 0:
        atomic_save(obj, path)
    dist.barrier()


def flat_tensors(tree, prefix="") -> dict:
    """{dotted key: tensor} of a nested state dict (for comparisons)."""
    out = {}
    if isinstance(tree, dict):
        for k, v in tree.items():
            out.update(flat_tensors(v, f"{prefix}{k}."))
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            out.update(flat_tensors(v, f"{prefix}{i}."))
    elif torch.is_tensor(tree):
        out[prefix[:-1]] = tree
    return out
