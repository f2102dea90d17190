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

    torchrun --standalone --nproc-per-node=2 -m source_code.sharding.train --checkpoint ckpt
    torchrun --standalone --nproc-per-node=4 -m source_code.sharding.train --checkpoint ckpt --resume
"""
from __future__ import annotations

import json
import os
import shutil
import uuid

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
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
    model_sd, optim_sd = get_state_dict(model, optimizer)  # the target layout of this run
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    return read_progress(directory)


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
