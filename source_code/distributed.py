"""Distributed plumbing shared by every script and notebook of the workshop.

One place decides how a process learns who it is and where it computes:

* ranks come from torchrun (RANK, LOCAL_RANK, WORLD_SIZE) or from a Slurm step started with
  srun and no torchrun (SLURM_PROCID, SLURM_LOCALID, SLURM_STEP_NUM_TASKS);
* the device and backend come from ``device_policy.choose`` (one GPU per process: cuda:LOCAL_RANK
  with the mixed backend "cpu:gloo,cuda:nccl"; otherwise gloo on the CPU, said in one line):
  the same file runs on a laptop and on a GPU node; other code asks ``context()``;
* print0 acts on rank 0 only; seeds are explicit and per rank;
* the session ends cleanly (see ``cleanup``), so every launch exits 0.

The lesson script ``training/ddp.py`` writes the plain lines out, as in a learner's own code::

    me, store = whoami(LAUNCH)                 # rank, device and backend, before joining
    if me.device.type == "cuda":
        torch.cuda.set_device(me.device)
    dist.init_process_group(me.backend, rank=me.rank, world_size=me.world_size, store=store)
    ...
    settle()                                   # gc + barrier: the clean-exit detail
    dist.destroy_process_group()

Typical use in a workshop script (``torchrun --standalone --nproc-per-node=2 -m PKG.MOD``)::

    def train(ctx, args):          # everything that holds the process group lives in here
        model = DDP(Net().to(ctx.device), device_ids=ctx.device_ids)
        ...
        return {"accuracy": acc}   # plain Python values only

    def main(argv=None):
        args = parser.parse_args(argv)
        with session(launch_hint="torchrun --standalone --nproc-per-node=2 -m PKG.MOD") as ctx:
            return train(ctx, args)
"""
from __future__ import annotations

import contextlib
import datetime
import gc
import os
import random
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from source_code import device_policy
from source_code.rendezvous import (agent_store, decide_together, free_port, meet, port_is_free,
                                    slurm_defaults)
from source_code.errors import LaunchError, run_main

__all__ = ["LaunchError", "Context", "context", "pick_device", "ranks_from_env", "whoami",
           "place", "setup", "settle", "cleanup", "session", "run_main", "print0", "seed_everything",
           "all_reduce_mean", "report_device", "free_port"]


@dataclass(frozen=True)
class Context:
    """Who this process is in the job and where it computes."""

    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    backend: str
    launcher: str  # "torchrun", "srun", "env" (variables set by hand) or "none" (world size 1)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def device_ids(self):
        """What DistributedDataParallel wants for device_ids: [index] on a GPU, None on CPU."""
        return [self.device.index] if self.device.type == "cuda" else None


# --------------------------------------------------------------------------- who am I
def pick_device(local_rank: int = 0, local_world_size: int = 1) -> tuple[torch.device, str]:
    """(device, backend) for this process: ``device_policy.choose`` (read its docstring)."""
    placed = device_policy.choose(local_rank, local_world_size)
    return placed.device, placed.backend


def place(rank: int, local_rank: int, world: int, store=None) -> device_policy.Placement:
    """One device decision for the whole job (``device_policy``): every rank's view goes to
    rank 0 through the rendezvous store (ours, or torchrun's agent store), rank 0 decides for
    all, every rank applies its part or raises the same one-line error. Without a store to
    share (world size 1, a launcher without one) the view of this process stands for its node."""
    shared = store if store is not None else (agent_store() if world > 1 else None)
    if shared is None:
        return device_policy.choose(local_rank, device_policy.local_world_size(os.environ, world))
    answer = decide_together(dist.PrefixStore("workshop/placement", shared), rank, world,
                             device_policy.view_of(local_rank), device_policy.decide)
    return device_policy.placement_from(answer, rank)


def ranks_from_env(env=None) -> tuple[int, int, int, str] | None:
    """(rank, local_rank, world_size, launcher) from the launcher's variables, or None.

    torchrun (and anyone setting RANK/WORLD_SIZE by hand) wins; otherwise a Slurm *step*
    (srun) is recognised by SLURM_STEP_NUM_TASKS, which the batch script itself does not have:
    a plain `python train.py` inside an sbatch script must not think it is one of N tasks.
    """
    env = os.environ if env is None else env
    if "RANK" in env or "WORLD_SIZE" in env:
        missing = [k for k in ("RANK", "WORLD_SIZE") if k not in env]
        if missing:
            raise LaunchError(f"error: {' and '.join(missing)} not set (RANK and WORLD_SIZE come "
                              "together); launch with torchrun, which sets both")
        launcher = "torchrun" if "TORCHELASTIC_RUN_ID" in env else "env"
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
        return rank, int(env.get("LOCAL_RANK", rank)), world, launcher
    if "SLURM_STEP_NUM_TASKS" in env and "SLURM_PROCID" in env:
        return (int(env["SLURM_PROCID"]), int(env.get("SLURM_LOCALID", 0)),
                int(env["SLURM_STEP_NUM_TASKS"]), "srun")
    return None


# --------------------------------------------------------------------------- helpers
def seed_everything(seed: int, rank: int = 0) -> None:
    """Seed Python, NumPy and torch; ``rank`` offsets the seed so ranks draw different noise."""
    s = seed + rank
    random.seed(s)
    np.random.seed(s % 2**32)
    torch.manual_seed(s)


def print0(*args, **kwargs) -> None:
    """print() on rank 0 only (or when no process group exists), flushed at once."""
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(*args, **kwargs, flush=True)


def report_device(group=None) -> torch.device:
    """Where a small reporting tensor must live for a collective on ``group``.

    Our own groups are gloo or the mixed ``cpu:gloo,cuda:nccl``: a CPU tensor goes through gloo.
    A framework's group may be plain ``nccl`` (Lightning, Accelerate, DeepSpeed on a GPU), which
    has no CPU backend ("No backend type associated with device type cpu"): there the tensor
    goes to this process's current GPU."""
    backend = str(dist.get_backend(group)).lower()
    if "gloo" in backend or "mpi" in backend or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def all_reduce_mean(value: float, group=None) -> float:
    """The mean of a Python number over all ranks of ``group`` (a reporting helper).

    The tensor lives where the group can carry it (``report_device``): the CPU through gloo,
    also in the mixed group of a GPU node; the GPU in a framework's plain NCCL group.
    SUM then divide, because gloo's ReduceOp.AVG arrived only in recent torch versions."""
    if not dist.is_initialized():
        return float(value)
    t = torch.tensor([float(value)], dtype=torch.float64, device=report_device(group))
    dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
    return t.item() / dist.get_world_size(group)


# --------------------------------------------------------------------------- setup / cleanup
_CURRENT: Context | None = None


def context() -> Context:
    """The Context of this process's group (set by ``setup``): where a helper computes.

    Functions run by ``processes.spawn`` or deep inside a script ask this instead of reading
    RANK/LOCAL_RANK themselves: one owner of the device and backend policy.
    """
    if _CURRENT is None:
        raise RuntimeError("no process group: call this inside session()/setup() or processes.spawn")
    return _CURRENT


def whoami(launch_hint: str | None = None) -> tuple[Context, dist.Store | None]:
    """Who this process is, where it computes, and where it meets the others: before joining.

    Returns the Context (rank, local rank and world size from the launcher; device and backend
    from the device policy) and the store to pass to ``init_process_group``: None under
    torchrun, which has gathered every process already (the group reads MASTER_ADDR/PORT);
    for srun and by-hand launches a store at MASTER_ADDR:MASTER_PORT that all ranks reached,
    so that a missing rank is named in one line instead of a silent wait. Every mistake (no
    launcher, no MASTER_ADDR, a busy port) is a one-line LaunchError naming the fix.
    """
    found = ranks_from_env()
    if found is None:
        raise LaunchError(f"error: no launcher found (RANK/WORLD_SIZE not set); run it as: "
                          f"{launch_hint or 'torchrun --standalone --nproc-per-node=2 SCRIPT'}")
    rank, local_rank, world, launcher = found
    if launcher == "srun":
        slurm_defaults(os.environ)
    for key in ("MASTER_ADDR", "MASTER_PORT"):
        if key not in os.environ:
            raise LaunchError(f"error: {key} not set; launch with torchrun, which sets it, or "
                              f"export {key} (e.g. MASTER_ADDR=localhost MASTER_PORT=29500)")
    port = int(os.environ["MASTER_PORT"])
    if launcher != "torchrun" and rank == 0 and not port_is_free(port):
        raise LaunchError(f"error: MASTER_PORT {port} is busy on this host; pick another, "
                          f"e.g. export MASTER_PORT={free_port()}")
    store = meet(rank, world) if launcher != "torchrun" else None
    placed = place(rank, local_rank, world, store)
    if placed.note and rank == 0:
        print(placed.note, flush=True)
    return _remember(Context(rank, local_rank, world, placed.device, placed.backend, launcher)), store


def setup(launch_hint: str | None = None, allow_single: bool = False,
          timeout_s: float = 300) -> Context:
    """Join the process group described by the environment and return the Context.

    The plain lines, as ``training/ddp.py`` writes them out: ``whoami``, ``torch.cuda.set_device``
    on a GPU, ``dist.init_process_group``. Without a launcher: world size 1 (a gloo group over
    an in-memory store) when ``allow_single``, otherwise a one-line LaunchError that shows
    ``launch_hint``.
    """
    if ranks_from_env() is None and allow_single:
        device, backend = pick_device(0)
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        return _remember(Context(0, 0, 1, device, backend, "none"))
    me, store = whoami(launch_hint)
    if me.device.type == "cuda":
        torch.cuda.set_device(me.device)
    dist.init_process_group(me.backend, store=store, rank=me.rank, world_size=me.world_size,
                            timeout=datetime.timedelta(seconds=timeout_s),
                            device_id=me.device if me.device.type == "cuda" else None)
    return me


def _remember(ctx: Context) -> Context:
    global _CURRENT
    _CURRENT = ctx
    return ctx


def settle() -> None:
    """The clean-exit detail before ``dist.destroy_process_group()``: free, then meet.

    Why it matters with torch 2.14.1 + gloo: each collective leaves a Work object whose last
    reference may be dropped by one of gloo's worker threads. If that happens while the
    interpreter is finalising, the thread cannot take the GIL, is torn down with a forced
    unwind, and the process dies with "terminate called without an active exception".
    So: (1) drop every Python object that still refers to the group (DDP modules, Work
    handles) while the interpreter is fully alive -- callers return from the function that
    owned them, then gc.collect() here frees cycles; (2) a barrier so no rank tears down while
    another still talks to it. Destroying the group then joins gloo's threads.
    """
    gc.collect()
    dist.barrier()


def cleanup(barrier: bool = True) -> None:
    """End the process group so the interpreter can exit cleanly: ``settle()`` (the barrier
    only when ``barrier``: after an error the others may never reach it), then destroy."""
    global _CURRENT
    _CURRENT = None
    if not dist.is_initialized():
        return
    try:
        if barrier:
            settle()
        else:
            gc.collect()
    finally:
        dist.destroy_process_group()
        gc.collect()


@contextlib.contextmanager
def session(launch_hint: str | None = None, allow_single: bool = False, seed: int | None = None):
    """``with session(...) as ctx:`` -- setup, optional per-rank seeding, and a clean cleanup.

    Keep models and optimizers inside a function called in the ``with`` block (not in the
    caller's own variables), so they are gone before cleanup() runs.
    """
    ctx = setup(launch_hint=launch_hint, allow_single=allow_single)
    if seed is not None:
        seed_everything(seed, ctx.rank)
    try:
        yield ctx
    except BaseException:
        # no barrier: the other ranks may be waiting in a collective this rank will never
        # join; they fail when this process ends instead of waiting out the timeout
        cleanup(barrier=False)
        raise
    cleanup()
