"""The workshop's one error type for mistakes a user can fix: bad flags, launches, devices.

``run_main`` (source_code/distributed.py) prints its message as one line on stderr, once per
job (rank 0) unless the error is about one rank only, and exits with status 2: no traceback
for a mistake that one sentence explains.
"""
from __future__ import annotations


class LaunchError(SystemExit):
    """One actionable line (exit status 2). ``every_rank``: print it on every rank that has it."""

    def __init__(self, message: str, every_rank: bool = False):
        super().__init__(2)
        self.message = message
        self.every_rank = every_rank

    def __str__(self) -> str:
        return self.message
