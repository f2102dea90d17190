"""Notebook 17's exercise: the check accepts the reference and right answers written other ways,
and names typical wrong answers in one line."""
from __future__ import annotations

import math
import types

import numpy as np

from source_code.resilience import young_daly
from source_code.resilience.exercise import CASES, check_snapshot_every, right
from source_code.solutions.nb17_resilience import snapshot_every_steps


def _copy(fn):
    """A copy with its own code: the check swaps the model's functions' code while it runs."""
    return types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


# copies, for the made-up answers: the check hides young_daly's functions (and names bound to them)
best_interval, waste_fraction = _copy(young_daly.best_interval), _copy(young_daly.waste_fraction)
# and of the reference, for answers made from it (the check hides the reference from any other answer)
reference = _copy(snapshot_every_steps)


def test_reference_passes():
    assert check_snapshot_every(snapshot_every_steps).startswith("correct")


def _mtbf(f):
    return 86400 / f


def _floor_of_best(c, s, f):
    return max(1, math.floor(best_interval(c, _mtbf(f)) / s))


def _grid_search(c, s, f):       # another way: scan whole steps around the first guess
    waste = lambda n: waste_fraction(n * s, c, _mtbf(f))
    guess = max(1, round(math.sqrt(2 * c * _mtbf(f)) / s))
    return min(range(1, 3 * guess + 2), key=waste)


def _first_order_capped(c, s, f):       # sqrt(2CM) - C, M beyond C >= 2M
    m = _mtbf(f)
    return max(1, round((math.sqrt(2 * c * m) - c) / s)) if c < 2 * m else max(1, round(m / s))


def _daly_eq37(c, s, f):        # Daly's higher-order estimate, in whole steps, at least one
    m = _mtbf(f)
    tau = m if c >= 2 * m else math.sqrt(2 * c * m) * (1 + math.sqrt(c / (2 * m)) / 3 + c / (2 * m) / 9) - c
    return max(1, round(tau / s))


def test_right_answers_written_another_way_pass():
    for fn in (_floor_of_best, _grid_search, _daly_eq37, lambda c, s, f: float(reference(c, s, f)),
               lambda c, s, f: np.int64(reference(c, s, f)),
               lambda c, s, f: np.float32(reference(c, s, f))):
        assert check_snapshot_every(fn).startswith("correct"), fn


def test_the_models_functions_are_hidden_from_the_answer_and_come_back():
    def one_call(c, s, f):
        return max(1, round(young_daly.best_interval(c, 86400 / f) / s))
    verdict = check_snapshot_every(one_call)
    assert verdict.startswith("wrong") and "hidden" in verdict and "\n" not in verdict, verdict
    assert young_daly.best_interval(1.0, 3600.0) == best_interval(1.0, 3600.0)
    assert young_daly.waste_fraction(60.0, 1.0, 3600.0) == waste_fraction(60.0, 1.0, 3600.0)


def _young(c, s, f):
    return max(1, round(math.sqrt(2 * c * _mtbf(f)) / s))


def _first_order_uncapped(c, s, f):
    m = _mtbf(f)
    return max(1, round((math.sqrt(2 * c * m) - c) / s)) if c < 2 * m else 1


def _mtbf_in_days(c, s, f):
    return max(1, round(best_interval(c, 1 / f) / s))


def _seconds_not_steps(c, s, f):
    return round(best_interval(c, _mtbf(f)))


def _no_factor_2(c, s, f):
    return max(1, round(math.sqrt(c * _mtbf(f)) / s))


def test_typical_wrong_answers_get_their_own_one_line_diagnosis():
    want = {_young: "Young's interval", _first_order_capped: "sqrt(2CM) - C", _first_order_uncapped: "sqrt(2CM) - C",
            _mtbf_in_days: "in seconds", _seconds_not_steps: "training steps", _no_factor_2: "factor 2"}
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
    assert check_snapshot_every(lambda *a: reference(*a) + 0.5).startswith("wrong: return a whole")
    assert check_snapshot_every(lambda c, s, f: reference(c, s, f) * 3).startswith("wrong: too large")


def test_the_cases_separate_the_model_from_its_approximations():
    """Where the snapshot is cheap the formulas are right too; the check also holds a case
    where both closed formulas waste more than the tolerance, one with C >= 2M, one with C < a step."""
    cheap = [c for c in CASES if c[0] < 1e-3 * _mtbf(c[2])]
    assert cheap and all(right(_young(*c), c) and right(_first_order_capped(*c), c) for c in cheap)
    assert any(not right(_young(*c), c) and not right(_first_order_capped(*c), c) for c in CASES)
    assert any(c >= 2 * _mtbf(f) for c, s, f in CASES)
    assert any(c < s for c, s, f in CASES)
    assert any(best_interval(c, _mtbf(f)) < s for c, s, f in CASES)      # the best is under one step


def test_an_answer_that_never_rounds_up_to_one_step_fails():
    for never_clamps in (lambda c, s, f: round(best_interval(c, _mtbf(f)) / s),
                         lambda c, s, f: math.floor(best_interval(c, _mtbf(f)) / s)):
        verdict = check_snapshot_every(never_clamps)
        assert verdict.startswith("wrong") and "at least one step" in verdict, verdict


def test_a_name_bound_to_the_model_before_the_check_is_hidden_too():
    from source_code.resilience import exercise
    bound = young_daly.best_interval

    def early_binding(c, s, f):
        return max(1, round(bound(c, 86400 / f) / s))

    def private_alias(c, s, f):
        return max(1, round(exercise._BEST(c, 86400 / f) / s))
    for fn in (early_binding, private_alias):
        verdict = check_snapshot_every(fn)
        assert verdict.startswith("wrong") and "hidden" in verdict, verdict
    assert young_daly.best_interval(1.0, 3600.0) == best_interval(1.0, 3600.0)


def test_a_reload_of_the_model_inside_the_answer_is_refused_and_undone():
    import importlib
    kept = young_daly.best_interval

    def reloaded(c, s, f):
        importlib.reload(young_daly)           # fresh functions, unhidden
        return max(1, round(young_daly.best_interval(c, 86400 / f) / s))
    verdict = check_snapshot_every(reloaded)
    assert verdict.startswith("wrong") and "hidden" in verdict, verdict
    assert young_daly.best_interval is kept and kept(1.0, 3600.0) == best_interval(1.0, 3600.0)
    assert check_snapshot_every(snapshot_every_steps).startswith("correct")


def test_the_band_is_tight_where_nearly_all_time_is_wasted():
    """A snapshot beyond twice the MTBF wastes 96 %: 1 % more waste alone would accept half or
    twice the best number of steps; the useful time's 1 % does not."""
    case = next(c for c in CASES if c[0] >= 2 * _mtbf(c[2]))
    best = best_interval(case[0], _mtbf(case[2])) / case[1]
    assert right(round(best), case)
    assert not right(math.floor(best / 2), case) and not right(math.ceil(2 * best), case)


def test_the_reference_solution_is_hidden_from_the_answer_and_comes_back():
    from source_code.solutions import nb17_resilience
    copied = nb17_resilience.snapshot_every_steps           # a name bound before the check, too
    verdict = check_snapshot_every(lambda c, s, f: copied(c, s, f))
    assert verdict.startswith("wrong") and "hidden" in verdict and "\n" not in verdict, verdict
    assert check_snapshot_every(nb17_resilience.snapshot_every_steps).startswith("correct")
    assert nb17_resilience.snapshot_every_steps(45.0, 2.0, 6.0) == copied(45.0, 2.0, 6.0) >= 1


def test_an_answer_that_imports_the_reference_during_the_check_is_refused():
    """The check itself never imports the solutions (the participants' copy has none); an answer
    that imports the reference inside its body finds the import refused while the check runs."""
    import sys
    loaded = sys.modules.pop("source_code.solutions.nb17_resilience", None)
    try:
        def importing(c, s, f):
            from source_code.solutions.nb17_resilience import snapshot_every_steps as ref
            return ref(c, s, f)
        verdict = check_snapshot_every(importing)
        assert not verdict.startswith("correct") and "\n" not in verdict, verdict
        assert "source_code.solutions.nb17_resilience" not in sys.modules   # nothing left behind
    finally:
        if loaded is not None:
            sys.modules["source_code.solutions.nb17_resilience"] = loaded


def test_the_notebook_shows_daly_eq37_only_after_the_exercise():
    """Eq. 37 in whole steps passes the check: the notebook shows it (formula, row, function)
    only after the exercise's check, as what an answer is compared with."""
    import json
    from pathlib import Path
    cells = json.loads((Path(__file__).resolve().parents[1] / "notebooks" / "17_resilience.ipynb").read_text())["cells"]
    exercise = next(i for i, c in enumerate(cells) if "def snapshot_every_steps" in "".join(c["source"]))
    for i, cell in enumerate(cells[:exercise]):
        shown = "".join(cell["source"]) + "".join(
            "".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/plain", "")) for o in cell.get("outputs", []))
        assert not any(word in shown for word in ("tfrac13", "daly_higher_order", "eq. 37\"", "eq. 37 ")), i
    after = "".join("".join(c["source"]) for c in cells[exercise + 1:])
    assert "tfrac13" in after and "daly_higher_order" in after
