"""Reference solution of notebook 17's exercise: steps between snapshots, from Daly's interval.

    from source_code.resilience.exercise import check_snapshot_every
    check_snapshot_every(snapshot_every_steps)
"""
from __future__ import annotations

import math


def snapshot_every_steps(snapshot_seconds: float, step_seconds: float, failures_per_day: float) -> int:
    mtbf = 86400 / failures_per_day                      # seconds between failures
    if snapshot_seconds >= 2 * mtbf:                     # Daly: a snapshot slower than that, once per MTBF
        interval = mtbf
    else:
        interval = math.sqrt(2 * snapshot_seconds * mtbf) - snapshot_seconds
    return max(1, round(interval / step_seconds))        # whole steps, at least one
