"""Reference solution of notebook 17's exercise: steps between snapshots, from the waste model.

    from source_code.resilience.exercise import check_snapshot_every
    check_snapshot_every(snapshot_every_steps)
"""
from __future__ import annotations

import math


def snapshot_every_steps(snapshot_seconds: float, step_seconds: float, failures_per_day: float) -> int:
    mtbf = 86400 / failures_per_day                      # seconds between failures

    def waste(steps: int) -> float:                      # section 2's model, for a whole number of steps
        tau = steps * step_seconds
        return 1 - tau / (mtbf * math.expm1((tau + snapshot_seconds) / mtbf))
    # the waste falls, then rises: walk down from a first guess in whole steps
    steps = max(1, round((math.sqrt(2 * snapshot_seconds * mtbf) - 2 * snapshot_seconds / 3) / step_seconds))
    while steps > 1 and waste(steps - 1) < waste(steps):
        steps -= 1
    while waste(steps + 1) < waste(steps):
        steps += 1
    return steps
