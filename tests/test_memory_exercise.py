"""Notebook 08's exercise: the reference solution passes, typical wrong answers fail, named."""
import pytest

from source_code.memory.exercises import check_predict_peak_bytes, measure_peak
from source_code.solutions.nb08_memory import predict_peak_bytes


@pytest.fixture(scope="module")
def measured():
    return measure_peak()


def test_solution_passes(measured):
    assert check_predict_peak_bytes(predict_peak_bytes, measured).startswith("correct")


@pytest.mark.parametrize("wrong, named", [
    (lambda *a: predict_peak_bytes(*a) - 4 * a[0], "params or the grads"),      # no gradients
    (lambda *a: predict_peak_bytes(*a) - 8 * a[0], "lacks the optimizer"),      # no Adam state
    (lambda *a: 16 * a[0], "lacks the activations"),                           # states only
    (lambda *a: predict_peak_bytes(*a) + 8 * a[0], "twice the optimizer"),      # 3 states, not 2
    (lambda *a: predict_peak_bytes(*a) / 2, "bytes per value"),                 # 2 bytes, not 4
])
def test_wrong_answers_fail_and_name_the_term(measured, wrong, named):
    with pytest.raises(AssertionError, match=named):
        check_predict_peak_bytes(wrong, measured)


def test_todo_says_not_done(measured):
    def todo(*args):
        raise NotImplementedError
    with pytest.raises(NotImplementedError, match="not done yet"):
        check_predict_peak_bytes(todo, measured)
