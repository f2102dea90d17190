"""Stragglers: every K steps, gather each rank's compute time per step and name the slow rank.

    python -m source_code.resilience.health_drill --slow-rank 2 --every 4

In synchronous data parallelism a slow rank slows every rank: the others wait for it inside
the gradient all-reduce, so their *total* step time is the slow one's too and says nothing.
What names it is the time each rank spends *before* the collective (data, forward, backward):
* ``StepTimes``: each rank records its compute seconds per step (start of step to the moment
  it enters the all-reduce), measured on the device's own clock: CUDA events on a GPU, the CPU
  time of the rank's thread here (wall time would also count the other processes that share
  the machine's cores);
* ``gather_medians``: every K steps an all-gather of each rank's median over the last K steps
  (world_size floats: cheap enough to run always);
* ``name_stragglers``: ranks slower than ``factor`` x the median rank.
"""
from __future__ import annotations

import statistics

from source_code.resilience.common import gather_floats


class StepTimes:
    def __init__(self):
        self.seconds: list[float] = []

    def add(self, seconds: float) -> None:
        self.seconds.append(seconds)

    def median_and_clear(self) -> float:
        m = statistics.median(self.seconds) if self.seconds else 0.0
        self.seconds.clear()
        return m


def gather_medians(times: StepTimes, group=None) -> list[float]:
    """Every rank's median compute time over its last steps (an all-gather of world_size floats)."""
    return gather_floats(times.median_and_clear(), group)


def name_stragglers(medians: list[float], factor: float = 1.5) -> list[int]:
    """Ranks whose median compute time exceeds ``factor`` x the median over ranks."""
    if factor <= 1:
        raise ValueError(f"factor must be > 1 (got {factor}): every rank would be 'slow'")
    typical = statistics.median(medians)
    return [r for r, m in enumerate(medians) if m > factor * typical]
