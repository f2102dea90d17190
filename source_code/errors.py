"""The workshop's one error type for mistakes a user can fix: bad flags, launches, devices.

``run_main`` (source_code/distributed.py) prints its message as one line on stderr, once per
job (rank 0) unless the error is about one rank only, and exits with status 2: no traceback
for a mistake that one sentence explains.
"""
from __future__ import annotations

import os
import sys


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
        if err.every_rank or os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")) == "0":
            print(err.message, file=sys.stderr, flush=True)
        code = 2
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code if isinstance(code, int) else 0)
