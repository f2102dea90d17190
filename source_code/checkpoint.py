"""Training snapshots: written atomically, refused when they belong to another model.

A snapshot holds everything needed to continue exactly where training stopped: model and
optimizer state, the number of finished epochs (which is also the DistributedSampler's epoch,
so the next shuffle is the one an uninterrupted run would draw) and every rank's RNG state.

Atomic write: torch.save into a temporary file in the same directory, fsync, then os.replace
over the old file. A kill at any moment leaves either the previous snapshot or the new one,
never a truncated file.

    python -m source_code.checkpoint show PATH     # print what a snapshot contains
"""
from __future__ import annotations

import argparse
import glob
import os
import random
import tempfile

import numpy as np
import torch
import torch.distributed as dist

from source_code.distributed import run_main
from source_code.errors import LaunchError


class CheckpointMismatch(LaunchError):
    """A snapshot that does not fit the model being trained (exit status 2, one line).

    A LaunchError, so that ``run_main`` prints the line instead of exiting silently.
    """


def atomic_save(obj, path) -> None:
    """torch.save(obj, path) such that ``path`` is always either the old or the new file.

    The temporary file is ``PATH.<random>.tmp`` in the same directory (os.replace is atomic
    only within one file system). An exception removes it; a SIGKILL cannot, so the next
    successful save removes such leftovers of killed writers (they can be gigabytes).
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    started = os.stat(tmp).st_mtime
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    _fsync_dir(directory)  # make the rename itself survive a power cut
    pattern = os.path.join(glob.escape(directory), glob.escape(os.path.basename(path)) + ".*.tmp")
    for stale in glob.glob(pattern):
        try:  # only files last touched before this write began: never a live writer's
            if os.stat(stale).st_mtime < started:
                os.remove(stale)
        except FileNotFoundError:
            pass


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # some file systems do not open directories
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def model_signature(model: torch.nn.Module) -> dict:
    """Class name plus every parameter/buffer name and shape: what "the same model" means here."""
    module = getattr(model, "module", model)  # DDP / DataParallel wrap the real model
    return {"class": type(module).__name__,
            "shapes": {k: tuple(v.shape) for k, v in module.state_dict().items()}}


def rng_state() -> dict:
    """This process's random streams. On a GPU only the current device's: each rank owns one
    GPU, and a restart may put the rank on another index (or another node). Only a process
    that computes on a GPU (CUDA initialised) reads it: asking would otherwise create a CUDA
    context on GPU 0 for a rank that fell back to the CPU."""
    return {"python": random.getstate(), "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state() if torch.cuda.is_initialized() else None}


def set_rng_state(state: dict) -> None:
    """Restore ``rng_state()``; the states must be CPU tensors (load snapshots to the CPU)."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_initialized():
        torch.cuda.set_rng_state(cuda[0] if isinstance(cuda, list) else cuda)


def save_snapshot(path, model, optimizer, epoch: int, extra: dict | None = None) -> None:
    """Collective: every rank contributes its RNG state; rank 0 writes the file atomically."""
    states = [rng_state()]
    if dist.is_initialized() and dist.get_world_size() > 1:
        states = [None] * dist.get_world_size()
        dist.all_gather_object(states, rng_state())
    if not dist.is_initialized() or dist.get_rank() == 0:
        module = getattr(model, "module", model)
        atomic_save({"signature": model_signature(model), "model": module.state_dict(),
                     "optimizer": optimizer.state_dict(), "epoch": epoch,
                     "rng": states, "extra": extra or {}}, path)
    if dist.is_initialized():
        dist.barrier()


def read_snapshot(path) -> dict:
    """The snapshot at ``path``; CheckpointMismatch (one line) for anything that is not one."""
    try:
        snap = torch.load(path, map_location="cpu", weights_only=False)
    except FileNotFoundError:
        raise CheckpointMismatch(f"error: no snapshot at {path}; start without --resume "
                                 "to train from scratch") from None
    except Exception as exc:
        raise CheckpointMismatch(f"error: {path} is not a readable snapshot ({type(exc).__name__}); "
                                 "delete it or point --checkpoint elsewhere") from None
    if not isinstance(snap, dict) or not {"signature", "model", "optimizer", "epoch"} <= snap.keys():
        raise CheckpointMismatch(f"error: {path} is not a training snapshot of this workshop; "
                                 "point --checkpoint at one written by --checkpoint")
    return snap


def load_snapshot(path, model, optimizer=None) -> dict:
    """Load a snapshot into ``model`` (and ``optimizer``); return it (epoch, extra, ...).

    Read to the CPU: the RNG states must be CPU tensors, and load_state_dict copies the
    weights (and the optimizer its state) onto the device the parameters live on.

    Restores this rank's RNG state when the world size matches the one that wrote it; with a
    different world size the RNG streams cannot match anyway, and each rank keeps its seed.
    """
    snap = read_snapshot(path)
    want, got = model_signature(model), snap["signature"]
    if want != got:
        diff = sorted(set(want["shapes"].items()) ^ set(got["shapes"].items()))[:1]
        raise CheckpointMismatch(
            f"error: {path} holds a {got['class']} but this run builds a {want['class']}"
            f"{' (first difference: ' + str(diff[0]) + ')' if diff else ''}; "
            "resume with the model that wrote it or use a new --checkpoint path")
    getattr(model, "module", model).load_state_dict(snap["model"])
    if optimizer is not None:
        optimizer.load_state_dict(snap["optimizer"])
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    if len(snap["rng"]) == world:
        set_rng_state(snap["rng"][rank])
    return snap


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    show = sub.add_parser("show", help="summarise a snapshot")
    show.add_argument("path")
    args = p.parse_args(argv)
    snap = read_snapshot(args.path)
    sig = snap["signature"]
    n = sum(int(np.prod(s)) for s in sig["shapes"].values())
    print(f"{args.path}: model={sig['class']} tensors={len(sig['shapes'])} numbers={n} "
          f"epochs_done={snap['epoch']} ranks_rng={len(snap.get('rng', []))} "
          f"extra={snap.get('extra', {})}")
    return 0


if __name__ == "__main__":
    run_main(main)
