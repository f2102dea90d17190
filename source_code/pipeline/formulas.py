"""Pipeline formulas: the bubble and the number of stored activations, in closed form.

With p stages of equal cost, m microbatches, forward cost F and backward cost B per microbatch
and stage, GPipe and 1F1B both take (m + p - 1)(F + B) per step while each stage computes
m (F + B): the idle fraction is (p - 1) / (m + p - 1), whatever F and B are. They differ in
memory: GPipe stores the activations of all m microbatches before the first backward, 1F1B
at most p - s on stage s (at most p anywhere).
"""
from __future__ import annotations


def bubble_theory(p: int, m: int) -> float:
    """Idle fraction of GPipe and 1F1B with equal stages: (p - 1) / (m + p - 1)."""
    return (p - 1) / (m + p - 1)


def step_time_theory(p: int, m: int, fwd: float, bwd: float) -> float:
    """(m + p - 1)(F + B): m microbatches' work plus p - 1 slots to fill and drain the pipe."""
    return (m + p - 1) * (fwd + bwd)


def stored_microbatches(schedule: str, p: int, m: int, s: int) -> int:
    """Most microbatches whose activations stage s holds at once (GPipe: m; 1F1B: min(p - s, m))."""
    if schedule in ("gpipe", "naive"):
        return m
    if schedule == "1f1b":
        return min(p - s, m)
    raise ValueError(f"unknown schedule {schedule!r}")


def relative_error(measured: float, theory: float) -> float:
    return abs(measured - theory) / theory
