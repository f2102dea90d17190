"""The drills' faults, kept out of the training loops they strike (harness, not lesson).

Each fault fires at a point the drill chooses, decided by the process itself, so that what
happens does not depend on how fast a poller notices (a harness that watches logs and kills
from outside lands at a different step on a loaded machine):

* ``die_in_torchft_allreduce(manager, after, log)``: the replica group SIGKILLs itself inside
  gradient all-reduce once ``after`` steps are committed and the step's quorum holds its peers:
  they are in the same all-reduce, which cannot complete, so they must throw that step away;
* ``die_in_ddp_allreduce(ddp, committed, after, log)``: the same for a DDP rank (a comm hook);
* ``die_with_agent()``: a node's failure seen from its worker: SIGKILL to its torchrun agent
  (the parent) and to itself;
* ``hold_until_restarted(what)``: wait at a step boundary until the launcher stops this worker
  (a node joining).

A death is SIGKILL, as a node failure or an out-of-memory kill ends a process: no exception,
no cleanup, the sockets closed by the kernel.
"""
from __future__ import annotations

import os
import signal
import time


def _die(log, **fields) -> None:
    log.write(event="kill", **fields)
    os.kill(os.getpid(), signal.SIGKILL)


def die_in_torchft_allreduce(manager, after: int, log, samples: int, replica: int) -> None:
    """Replace ``manager.allreduce`` (torchft's DDP comm hook calls it) by one that dies at
    the step after ``after`` committed steps: ``samples`` computed for nothing.

    It dies only once this step's quorum is settled with its peers in it (``num_participants``
    waits for the quorum): every peer's all-reduce of this step then includes this group and
    cannot complete, so each peer records the error and throws the step away, however fast or
    slow either side is. (Dying before the quorum is settled could let the lighthouse form the
    step's quorum without this group, once its heartbeat stopped: the peers would commit.)"""
    allreduce = manager.allreduce

    def maybe_die(tensor, *args, **kwargs):
        if manager.current_step() == after and manager.num_participants() > 1:
            print(f"replica {replica}: killed in the all-reduce of step {after + 1} (SIGKILL)", flush=True)
            _die(log, replica=replica, step=after, samples=samples)
        return allreduce(tensor, *args, **kwargs)
    manager.allreduce = maybe_die


def die_in_ddp_allreduce(ddp, committed, after, log, samples: int, rank: int) -> None:
    """A DDP comm hook that all-reduces as torch's ``allreduce_hook`` does, and dies when
    ``committed()`` (steps finished so far) equals ``after`` (None: never). Registered on every
    rank, so that all ranks reduce in the same order and stay bitwise equal."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    def hook(state, bucket):
        if after is not None and committed() == after:
            print(f"rank {rank}: killed in the all-reduce of step {after + 1} (SIGKILL)", flush=True)
            _die(log, rank=rank, step=after, samples=samples)
        return allreduce_hook(state, bucket)
    ddp.register_comm_hook(dist.group.WORLD, hook)


def die_with_agent() -> None:
    """The node dies: its torchrun agent (this worker's parent) and this worker, SIGKILL."""
    os.kill(os.getppid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def hold_until_restarted(what: str, deadline_s: float = 120.0) -> None:
    """Wait here (a step boundary, the checkpoint written) until the launcher stops this worker;
    past ``deadline_s`` an error that says what never came. No flag lets it go on by itself: a
    worker that stepped on while its agent stopped it would make the drill's count depend on
    which came first."""
    time.sleep(deadline_s)
    raise TimeoutError(f"no {what} within {deadline_s:.0f} s")
