"""Notebook 10's exercise: the reference 1F1B order passes the check, typical wrong answers fail."""
import pytest

from source_code.pipeline.exercises import check_1f1b_order, run_for_real
from source_code.solutions import nb10_pipeline


def test_solution_passes():
    assert check_1f1b_order(nb10_pipeline.one_f_one_b).startswith("correct")


def gpipe(p, m, s):  # all forwards, then all backwards: right result, m activations stored
    return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]


def one_warmup_too_many(p, m, s):
    return _with_warmup(p, m, min(p - s, m))


def no_warmup(p, m, s):  # valid and frugal, but the pipeline runs dry
    return _with_warmup(p, m, 0)


def warmup_from_wrong_end(p, m, s):  # stage index reversed: the last stage warms up longest
    return _with_warmup(p, m, min(s, m))


def backward_first(p, m, s):  # steady state B before F
    w = min(p - s - 1, m)
    order = [("F", i) for i in range(w)]
    for k in range(m - w):
        order += [("B", k), ("F", w + k)]
    return order + [("B", i) for i in range(m - w, m)]


def _with_warmup(p, m, w):
    order = [("F", i) for i in range(w)]
    for k in range(m - w):
        order += [("F", w + k), ("B", k)]
    return order + [("B", i) for i in range(m - w, m)]


@pytest.mark.parametrize("wrong, message", [
    (gpipe, "activations at once"),
    (one_warmup_too_many, "activations at once"),
    (no_warmup, "runs dry"),
    (warmup_from_wrong_end, "deadlock"),
    (backward_first, "comes before"),
])
def test_wrong_orders_fail(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_1f1b_order(wrong)


def test_unfinished_answer_is_reported():
    def todo(p, m, s):
        raise NotImplementedError
    with pytest.raises(NotImplementedError, match="not done yet"):
        check_1f1b_order(todo)


@pytest.mark.parity
def test_solution_runs_for_real():
    res = run_for_real(nb10_pipeline.one_f_one_b, p=2, m=4)
    assert res["executed"] == res["orders"]          # the processes ran exactly these orders
    assert res["peak_in_flight"] == [2, 1]           # min(p - s, m)
    assert res["tol"] == 1e-6 and res["grad_diff"] <= res["tol"] and res["loss_diff"] <= res["tol"]
