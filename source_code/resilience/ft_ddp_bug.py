"""Why ft_replica.py calls ``manager.allreduce`` itself: torchft 0.2's DDP wrapper on a failed all-reduce.

    python -m source_code.resilience.ft_ddp_bug

``torchft.DistributedDataParallel`` routes DDP's gradient buckets through a comm hook:
``work = manager.allreduce(bucket.buffer()); work.wait(); fut = work.get_future();
assert fut._fut``. When the peer dies inside the all-reduce, ``work.wait()`` catches the error
and reports it to the manager (so that ``should_commit`` rejects the step), but the future the
hook then asserts on was never set: the assert fails inside the backward pass and the *survivor*
dies too. This runs torchft's own hook and work classes in this process on a work whose
wait raises what gloo raises when its peer is gone (no processes, no network): the manager
records the error, and the hook raises AssertionError. The same ``manager.allreduce`` waited
on directly (ft_replica.step_once) records the error and returns.
"""
from __future__ import annotations

import logging

import torch
import torch.distributed as dist

from source_code.errors import run_main


class _PeerGone(dist._Work):
    """A work whose wait fails as gloo's does once the peer's socket is closed."""

    def wait(self, timeout=None):
        raise RuntimeError("[gloo] Connection closed by peer")

    def get_future(self):
        fut = torch.futures.Future()
        fut.set_exception(RuntimeError("[gloo] Connection closed by peer"))
        return fut


class _Manager:
    """The two things torchft's work classes ask of a Manager on this path."""

    def __init__(self):
        self._logger, self.error = logging.getLogger("ft_ddp_bug"), None
        self._logger.disabled = True

    def report_error(self, e):
        self.error = e

    def allreduce(self, tensor):
        from torchft.manager import _ManagedWork
        return _ManagedWork(self, _PeerGone(), tensor)


class _Bucket:
    def buffer(self):
        return torch.ones(4)


def reproduce() -> dict:
    """What the manager recorded and what each way of waiting did, with torchft's own code."""
    from source_code.resilience import ft_run      # quiets torchft's Rust logging before it loads
    from torchft.ddp import DistributedDataParallel
    direct, hooked = _Manager(), _Manager()
    waited = direct.allreduce(torch.ones(4)).wait()              # ft_replica's way
    try:
        DistributedDataParallel._comm_hook(hooked, _Bucket())    # torchft's DDP wrapper's way
        hook = "returned"
    except AssertionError:
        hook = "AssertionError"
    return {"direct_wait_returned": waited, "direct_error": repr(direct.error),
            "hook": hook, "hook_error_recorded": hooked.error is not None}


def main(argv=None):
    from source_code.resilience.ft_run import require_torchft
    require_torchft()                                   # one line where torchft is missing
    r = reproduce()
    print(f"summary: direct_wait_returned={r['direct_wait_returned']} error_recorded={int(r['direct_error'] != 'None')} "
          f"ddp_hook={r['hook']} ddp_hook_error_recorded={int(r['hook_error_recorded'])}")
    return 0


if __name__ == "__main__":
    run_main(main)
