"""The workshop's one error type for mistakes a user can fix: bad flags, launches, devices.

``run_main`` (source_code/distributed.py) prints its message as one line on stderr, once per
job (rank 0) unless the error is about one rank only, and exits with status 2: no traceback
for a mistake that one sentence explains.

Under torchrun the first rank to exit makes the agent stop all the others: a rank other than 0
that exits first could stop rank 0 before it prints. So such a rank waits until rank 0 says in
the agent's store that its line is out (or until the agent stops it) before it exits.
"""
from __future__ import annotations

import datetime
import os
import sys

PRINTED_KEY = "launch_error/printed"


class LaunchError(SystemExit):
    """One actionable line (exit status 2). ``every_rank``: print it on every rank that has it."""

    def __init__(self, message: str, every_rank: bool = False):
        super().__init__(2)
        self.message = message
        self.every_rank = every_rank

    def __str__(self) -> str:
        return self.message


def run_main(main) -> None:
    """Entry-point wrapper: ``if __name__ == "__main__": run_main(main)``.

    Turns LaunchError into one line on stderr with exit status 2, printed once per job (by
    rank 0, or by every rank for an error about that rank alone), and flushes output before
    the interpreter exits.
    """
    try:
        code = main()
    except LaunchError as err:
        rank = os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))
        if err.every_rank or rank == "0":
            print(err.message, file=sys.stderr, flush=True)
        if rank == "0":
            _say_printed()
        elif not err.every_rank:
            _wait_for_rank_0()
        code = 2
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code if isinstance(code, int) else 0)


def _store():
    """The torchrun agent's store (None outside torchrun or when it cannot be reached)."""
    try:
        from source_code.rendezvous import agent_store
        return agent_store()
    except Exception:  # noqa: BLE001 - no store: nothing to coordinate through
        return None


def _say_printed() -> None:
    store = _store()
    if store is not None:
        try:
            store.set(PRINTED_KEY, "1")
        except Exception:  # noqa: BLE001 - the agent is gone: nobody waits
            pass


def _wait_for_rank_0() -> None:
    """Block until rank 0 has printed the job's line (the agent then stops this rank, or the key
    comes); bounded by the rendezvous timeout in case rank 0 never raises."""
    store = _store()
    if store is None:
        return
    wait_s = float(os.environ.get("WORKSHOP_RENDEZVOUS_TIMEOUT", "120"))
    try:
        store.wait([PRINTED_KEY], datetime.timedelta(seconds=wait_s))
    except Exception:  # noqa: BLE001 - timed out or the agent went away: exit as before
        pass
