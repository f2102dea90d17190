"""Notebook 17's exercise: how many steps between snapshots, for a failure rate and a snapshot cost.

The learner writes ``snapshot_every_steps(snapshot_seconds, step_seconds, failures_per_day)``
returning the number of training steps between two snapshots that wastes the least time.
``check_snapshot_every(fn)`` runs it on configurations the notebook never prints and returns
one line: "correct: ..." or what is wrong (it never raises through the learner's cell).
"""
from __future__ import annotations

import math

from source_code.resilience import young_daly

# (snapshot seconds, step seconds, failures per day): a laptop drill, a big cluster, a costly
# snapshot, a flaky job, a snapshot slower than half the MTBF, a snapshot cost below a step
CASES = [(0.03, 0.05, 24.0), (45.0, 2.0, 6.0), (600.0, 10.0, 24.0), (20.0, 0.5, 96.0),
         (50_000.0, 30.0, 4.0), (0.2, 1.5, 0.5)]


def expected(snapshot_s: float, step_s: float, failures_per_day: float) -> int:
    return max(1, round(young_daly.daly_interval(snapshot_s, 86400 / failures_per_day) / step_s))


def _close(got, want) -> bool:
    return abs(got - want) <= max(1, 0.02 * want)


def _diagnose(fn_values: list, cases) -> str:
    """Name a typical mistake whose numbers the answer matches on every case, if any."""
    def steps(seconds, step):
        return max(1, round(seconds / step))
    missing_2 = "the factor 2 under the square root is missing (the work redone is half an interval on average)"
    patterns = [
        ("it matches Young's interval: Daly's subtracts the snapshot's own cost once more",
         lambda c, s, f: steps(math.sqrt(2 * c * 86400 / f), s)),
        ("the time between failures must be in seconds (a day has 86400 of them), not in days",
         lambda c, s, f: steps(young_daly.daly_interval(c, 1 / f), s)),
        ("that is an interval in seconds: the question asks for training steps",
         lambda c, s, f: young_daly.daly_interval(c, 86400 / f)),
        (missing_2, lambda c, s, f: steps(math.sqrt(c * 86400 / f), s)),
        (missing_2, lambda c, s, f: steps(math.sqrt(c * 86400 / f) - c, s)),
        ("a snapshot slower than half the time between failures: snapshot once per MTBF (Daly's case C >= 2M)",
         lambda c, s, f: steps(math.sqrt(2 * c * 86400 / f) - c, s) if c < 2 * 86400 / f else 1),
    ]
    for message, formula in patterns:
        try:
            if all(_close(v, formula(*case)) for v, case in zip(fn_values, cases)):
                return message
        except (ValueError, ZeroDivisionError):
            continue
    return ""


def check_snapshot_every(fn) -> str:
    values = []
    for case in CASES:
        try:
            got = fn(*case)
        except NotImplementedError:
            return "not done yet: write snapshot_every_steps, then run this cell again"
        except Exception as exc:                  # one line, no traceback through the checker
            return f"wrong: it raised {type(exc).__name__}: {exc}"[:200]
        if isinstance(got, bool) or not isinstance(got, (int, float)) or got != got:
            return f"wrong: return a number of steps (an int), got {got!r}"[:200]
        values.append(got)
    bad = [i for i, (v, case) in enumerate(zip(values, CASES)) if not _close(v, expected(*case))]
    if not bad:
        return f"correct: the least-waste snapshot interval on all {len(CASES)} configurations"
    if any(v < 1 for v in values):
        return "wrong: a snapshot interval is at least one step"
    hint = _diagnose(values, CASES)
    if hint:
        return f"wrong: {hint}"
    c, s, f = CASES[bad[0]]
    side = "large" if values[bad[0]] > expected(c, s, f) else "small"
    return (f"wrong: too {side} for snapshot={c} s, step={s} s, {f} failures a day "
            f"({len(bad)} of {len(CASES)} configurations off)")
