"""Notebook 17's exercise: how many steps between snapshots, for a failure rate and a snapshot cost.

The learner writes ``snapshot_every_steps(snapshot_seconds, step_seconds, failures_per_day)``
returning the number of training steps between two snapshots that wastes the least time in
section 2's model (young_daly.waste_fraction). ``check_snapshot_every(fn)`` runs it on
configurations the notebook never prints and accepts any whole number of steps whose waste in
that model is within ``TOLERANCE`` of the least a whole number of steps can waste (the minimum
is flat: the closed formulas, rounding up or down, are all right where the model says so). It
returns one line: "correct: ..." or what is wrong (it never raises through the learner's cell).
Any whole number counts, whatever its type (an int, a float such as 12.0, a NumPy integer).
While the learner's function runs, young_daly's functions are hidden (their code is swapped
for a one-line error, so a name bound to them earlier is hidden too; a reload of the module is
undone and refused): calling ``best_interval`` would be the whole answer, and the exercise is to
find the best whole number of steps from section 2's formula. The reference solution in
source_code.solutions is hidden the same way where it is loaded (unless it is the function
checked), and its import is refused during the check where it is not.
"""
from __future__ import annotations

import contextlib
import math
import numbers
import sys

from source_code.resilience import young_daly

# the model's functions, kept for the check itself (the learner's code finds them hidden)
_WASTE, _BEST = young_daly.waste_fraction, young_daly.best_interval
HIDDEN = ("waste_fraction", "best_interval", "young_interval", "daly_first_order", "first_order_interval",
          "daly_higher_order", "simulate")
HIDDEN_MESSAGE = ("young_daly's functions (and the reference solution) are hidden during the check: find "
                  "the best whole number of steps from section 2's waste formula yourself")

TOLERANCE = 0.01       # at most 1 % more waste, and 1 % less useful time, than the best whole number of steps
# (snapshot seconds, step seconds, failures per day): a laptop drill, a big cluster, a costly
# snapshot, one near the MTBF, a flaky job, a snapshot slower than twice the MTBF, a snapshot
# cheaper than a step, and one whose best interval is under one step (the answer must be 1)
CASES = [(0.03, 0.05, 24.0), (45.0, 2.0, 6.0), (600.0, 10.0, 24.0), (3000.0, 10.0, 24.0),
         (20.0, 0.5, 96.0), (50_000.0, 30.0, 4.0), (0.2, 1.5, 0.5), (0.002, 60.0, 24.0)]


def waste(steps: float, snapshot_s: float, step_s: float, failures_per_day: float) -> float:
    return _WASTE(steps * step_s, snapshot_s, 86400 / failures_per_day)


def least_waste(snapshot_s: float, step_s: float, failures_per_day: float) -> float:
    """The least waste a whole number (>= 1) of steps gets, next to the model's best interval."""
    best = _BEST(snapshot_s, 86400 / failures_per_day) / step_s
    return min(waste(n, snapshot_s, step_s, failures_per_day)
               for n in {max(1, math.floor(best)), max(1, math.ceil(best))})


def right(steps, case) -> bool:
    """Within 1 % of the best on both sides: the waste (tight where little is wasted) and the
    useful time left (tight where nearly all of it is wasted, as with a snapshot beyond the MTBF)."""
    got, best = waste(steps, *case), least_waste(*case)
    return steps >= 1 and got <= (1 + TOLERANCE) * best and 1 - got >= (1 - TOLERANCE) * (1 - best)


DALY = ("it is sqrt(2CM) - C, the model to first order: right where the snapshot is cheap against the time "
        "between failures; where it is not (and where sqrt(2CM) - C is not even positive), minimise the model itself")


def _diagnose(fn_values: list, cases) -> str:
    """Name a typical mistake whose numbers the answer matches on every case, if any."""
    def steps(seconds, step):
        return max(1, round(seconds / step))

    def close(got, want):
        return abs(got - want) <= max(1, 0.02 * want)
    patterns = [
        ("it is Young's interval (the first-order model without the snapshot in the period): right "
         "where the snapshot is cheap against the time between failures, not where it is not",
         lambda c, s, f: steps(math.sqrt(2 * c * 86400 / f), s)),
        (DALY, lambda c, s, f: steps(math.sqrt(2 * c * 86400 / f) - c, s) if c < 2 * 86400 / f else 1),
        (DALY, lambda c, s, f: steps(math.sqrt(2 * c * 86400 / f) - c, s) if c < 2 * 86400 / f
         else steps(86400 / f, s)),
        ("the time between failures must be in seconds (a day has 86400 of them), not in days",
         lambda c, s, f: steps(_BEST(c, 1 / f), s)),
        ("that is an interval in seconds: the question asks for training steps",
         lambda c, s, f: _BEST(c, 86400 / f)),
        ("the factor 2 is missing (on average half an interval is redone after a failure)",
         lambda c, s, f: steps(math.sqrt(c * 86400 / f), s)),
    ]
    for message, formula in patterns:
        try:
            if all(close(v, formula(*case)) for v, case in zip(fn_values, cases)):
                return message
        except (ValueError, ZeroDivisionError, OverflowError):
            continue
    return ""


class Hidden(RuntimeError):
    pass


def _hidden_body(*_args, **_kwargs):
    raise PermissionError("young_daly's functions (and the reference solution) are hidden during the check: find "
                          "the best whole number of steps from section 2's waste formula yourself")


# the reference solution's module: the instructor's copy has it, the participants' has none, and
# the check never imports it (loaded already, it is hidden; not loaded, its import is refused)
REFERENCE = "source_code.solutions.nb17_resilience"


def _hideable(answer) -> list:
    """(module, name) of every function hidden from ``answer``: young_daly's, and the reference
    solution's where it is loaded, unless ``answer`` is that function."""
    pairs = [(young_daly, name) for name in HIDDEN]
    reference = sys.modules.get(REFERENCE)
    if reference is not None and answer is not reference.snapshot_every_steps:
        pairs.append((reference, "snapshot_every_steps"))
    return pairs


@contextlib.contextmanager
def _hidden(answer=None):
    """The functions' code itself is swapped, so that a name bound to them before the check
    (``bi = young_daly.best_interval``, this module's ``_BEST``) raises too; a module whose
    functions were replaced meanwhile (``importlib.reload(young_daly)`` binds fresh, unhidden
    ones) gets its own back, and the answer counts as one that called them."""
    pairs = _hideable(answer)
    functions = [getattr(module, name) for module, name in pairs]
    kept = [fn.__code__ for fn in functions]
    unloaded = REFERENCE not in sys.modules
    if unloaded:   # an import of it inside the answer fails (None in sys.modules refuses it)
        sys.modules[REFERENCE] = None
    try:
        for fn in functions:
            fn.__code__ = _hidden_body.__code__
        yield
        if any(getattr(module, name) is not fn for (module, name), fn in zip(pairs, functions)):
            raise Hidden(HIDDEN_MESSAGE)
    except PermissionError as exc:
        if str(exc) == HIDDEN_MESSAGE:
            raise Hidden(HIDDEN_MESSAGE) from None
        raise
    finally:
        if unloaded and sys.modules.get(REFERENCE, 0) is None:
            del sys.modules[REFERENCE]
        for (module, name), fn, code in zip(pairs, functions, kept):
            fn.__code__ = code
            setattr(module, name, fn)


def check_snapshot_every(fn) -> str:
    values = []
    for case in CASES:
        try:
            with _hidden(fn):
                got = fn(*case)
        except NotImplementedError:
            return "not done yet: write snapshot_every_steps, then run this cell again"
        except Hidden:
            return f"wrong: {HIDDEN_MESSAGE}"
        except Exception as exc:                  # one line, no traceback through the checker
            return f"wrong: it raised {type(exc).__name__}: {exc}"[:200]
        if isinstance(got, bool) or not isinstance(got, numbers.Real) or got != got or math.isinf(got):
            return f"wrong: return a number of steps (an int), got {got!r}"[:200]
        values.append(float(got))
    if any(v < 1 for v in values):
        return "wrong: a snapshot interval is at least one step"
    if any(v != int(v) for v in values):
        return "wrong: return a whole number of steps"
    bad = [i for i, (v, case) in enumerate(zip(values, CASES)) if not right(v, case)]
    if not bad:
        return f"correct: within {100 * TOLERANCE:.0f} % of the least waste on all {len(CASES)} configurations"
    hint = _diagnose(values, CASES)
    if hint:
        return f"wrong: {hint}"
    c, s, f = CASES[bad[0]]
    side = "large" if values[bad[0]] > _BEST(c, 86400 / f) / s else "small"
    return (f"wrong: too {side} for snapshot={c} s, step={s} s, {f} failures a day "
            f"({len(bad)} of {len(CASES)} configurations waste more than they must)")
