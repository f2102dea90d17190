"""Notebook 17's exercise: the check accepts the reference and names typical wrong answers in one line."""
from __future__ import annotations

import math

from source_code.resilience.exercise import CASES, check_snapshot_every
from source_code.solutions.nb17_resilience import snapshot_every_steps


def test_reference_passes():
    assert check_snapshot_every(snapshot_every_steps).startswith("correct")


def _young(c, s, f):
    return max(1, round(math.sqrt(2 * c * 86400 / f) / s))


def _mtbf_in_days(c, s, f):
    m = 1 / f
    return max(1, round((math.sqrt(2 * c * m) - c) / s)) if c < 2 * m else max(1, round(m / s))


def _seconds_not_steps(c, s, f):
    m = 86400 / f
    return math.sqrt(2 * c * m) - c if c < 2 * m else m


def _no_factor_2(c, s, f):
    return max(1, round((math.sqrt(c * 86400 / f) - c) / s))


def _no_daly_branch(c, s, f):
    return max(1, round((math.sqrt(2 * c * 86400 / f) - c) / s))


def test_typical_wrong_answers_get_their_own_one_line_diagnosis():
    want = {_young: "Young", _mtbf_in_days: "in seconds", _seconds_not_steps: "steps",
            _no_factor_2: "factor 2", _no_daly_branch: "C >= 2M"}
    for fn, phrase in want.items():
        verdict = check_snapshot_every(fn)
        assert verdict.startswith("wrong") and phrase in verdict and "\n" not in verdict, (fn.__name__, verdict)


def test_unfinished_raising_and_non_numbers_are_one_line():
    def todo(*_):
        raise NotImplementedError

    def broken(c, s, f):
        return 1 / 0

    assert check_snapshot_every(todo).startswith("not done yet")
    assert check_snapshot_every(broken).startswith("wrong: it raised ZeroDivisionError")
    assert check_snapshot_every(lambda *a: "10").startswith("wrong: return a number")
    assert check_snapshot_every(lambda c, s, f: snapshot_every_steps(c, s, f) * 3).startswith("wrong: too large")


def test_the_check_covers_the_daly_cap_and_a_snapshot_cheaper_than_a_step():
    assert any(c >= 2 * 86400 / f for c, s, f in CASES)
    assert any(c < s for c, s, f in CASES)
