"""Pipeline formulas: the bubble and the number of stored activations, in closed form.

With p stages of equal cost, m microbatches, forward cost F and backward cost B per microbatch
and stage, GPipe and 1F1B both take (m + p - 1)(F + B) per step while each stage computes
m (F + B): the idle fraction is (p - 1) / (m + p - 1), whatever F and B are. They differ in
memory: GPipe stores the activations of all m microbatches before the first backward, 1F1B
at most p - s on stage s (at most p anywhere).

Two ways to say how big the bubble is, for a step of T on p ranks that each compute C:

* the **idle fraction** idle / (p T) (what bubble.py measures): (p - 1) / (m + p - 1) for 1F1B;
* the **bubble ratio** idle / busy = (T - C) / C, the bubble relative to the ideal step C
  (what the papers of interleaved 1F1B and zero-bubble write): (p - 1) / m for 1F1B.

They are one number said twice: fraction = ratio / (1 + ratio). The schedules of
more_schedules.py: interleaved 1F1B with v chunks per rank (p - 1) / (v m), ZB-H1 with the
backward split into B (input gradient) and W (weight gradient)
(p - 1)(F + B - min(F, W)) / (m (F + B + W)).
"""
from __future__ import annotations


def bubble_theory(p: int, m: int) -> float:
    """Idle fraction of GPipe and 1F1B with equal stages: (p - 1) / (m + p - 1)."""
    return (p - 1) / (m + p - 1)


def step_time_theory(p: int, m: int, fwd: float, bwd: float) -> float:
    """(m + p - 1)(F + B): m microbatches' work plus p - 1 slots to fill and drain the pipe."""
    return (m + p - 1) * (fwd + bwd)


def interleaved_bubble(p: int, m: int, v: int) -> float:
    """Bubble ratio (idle / busy) of interleaved 1F1B with v chunks per rank: (p - 1) / (v m)."""
    return (p - 1) / (v * m)


def zb_h1_bubble(p: int, m: int, fwd: float, bwd: float, wgt: float) -> float:
    """Bubble ratio of ZB-H1, B = input gradient, W = weight gradient:
    (p - 1)(F + B - W) / (m (F + B + W)) for W <= F (the paper's); min(F, W) in place of W
    otherwise (the simulator's)."""
    return (p - 1) * (fwd + bwd - min(fwd, wgt)) / (m * (fwd + bwd + wgt))


def idle_fraction(ratio: float) -> float:
    """The idle fraction idle / (p T) of a bubble ratio idle / busy."""
    return ratio / (1 + ratio)


def stored_microbatches(schedule: str, p: int, m: int, s: int) -> int:
    """Most microbatches whose activations stage s holds at once (GPipe: m; 1F1B: min(p - s, m);
    ZB-H1: p, a microbatch's activations stay until its W)."""
    if schedule in ("gpipe", "naive"):
        return m
    if schedule == "1f1b":
        return min(p - s, m)
    if schedule == "zb-h1":
        return p
    raise ValueError(f"unknown schedule {schedule!r}")


def relative_error(measured: float, theory: float) -> float:
    return abs(measured - theory) / theory
