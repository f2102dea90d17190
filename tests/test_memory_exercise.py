"""Notebook 08's exercise: the reference solution passes on the configurations the check draws,
typical wrong answers fail with the one line that names what they got wrong, and the check
never raises (the learner's exceptions, a missing answer and the calculator shortcut included)."""
import pytest

from source_code.memory.calculator import training_memory
from source_code.memory.exercises import WRONG_MODELS, check_predict_peak_bytes, draw
from source_code.solutions.nb08_memory import STATE_BYTES, predict_peak_bytes as ref


def grads(c):
    return (4 if c["precision"] == "fp32" else 2) * c["n_params"]


def optimizer(c):
    """AdamW's moments (+ the fp32 master copy in bf16-mixed): the state less weights and gradients."""
    return STATE_BYTES[c["precision"]] * c["n_params"] - 2 * grads(c)


def bf16(c, nbytes):
    return nbytes if c["precision"] == "bf16-mixed" else 0


WRONG = {
    "no gradients": (lambda c: ref(c) - grads(c), "one of the weights or the gradients is missing"),
    "fp32 weights and gradients at 2 bytes": (
        lambda c: ref(c) - (4 * c["n_params"] if c["precision"] == "fp32" else 0), "fp32 weights and gradients are 4 bytes"),
    "bf16 weights and gradients at 4 bytes": (
        lambda c: ref(c) + bf16(c, 4 * c["n_params"]), "keeps its weights and gradients in bf16"),
    "no fp32 master copy": (lambda c: ref(c) - bf16(c, 4 * c["n_params"]), "master copy"),
    "no optimizer state": (lambda c: ref(c) - optimizer(c), "the optimizer state is missing"),
    "no activations": (lambda c: STATE_BYTES[c["precision"]] * c["n_params"], "the activations are missing"),
    "fp32 activations in bf16": (
        lambda c: ref({**c, "precision": "fp32"}) if c["precision"] == "bf16-mixed" else ref(c),
        "activations are 2 bytes a value"),
    "everything halved": (lambda c: ref(c) / 2, "halved"),
    "optimizer counted twice": (lambda c: ref(c) + optimizer(c), "optimizer state is counted twice"),
}


@pytest.mark.parametrize("seed", [8, 1, 2, 3])
def test_reference_passes(seed):
    assert check_predict_peak_bytes(ref, seed).startswith("correct"), seed


def test_draws_both_precisions_and_both_regimes():
    configs = draw(8)
    assert {c["precision"] for c in configs} == {"fp32", "bf16-mixed"}
    assert all(c["hidden"] % c["heads"] == 0 for c in configs)
    assert draw(8) == configs and draw(9) != configs


@pytest.mark.parametrize("name", list(WRONG))
@pytest.mark.parametrize("seed", [8, 3])
def test_wrong_answers_fail_with_one_precise_line(name, seed):
    wrong, says = WRONG[name]
    verdict = check_predict_peak_bytes(wrong, seed)
    assert verdict.startswith("not yet") and says in verdict and "\n" not in verdict, (name, verdict)


def test_a_typed_number_fails():
    verdict = check_predict_peak_bytes(lambda c: 8.38 * 2 ** 20)
    assert verdict.startswith("not yet") and "times the measured peak" in verdict


def test_the_check_never_raises():
    def todo(c):
        raise NotImplementedError
    assert check_predict_peak_bytes(todo).startswith("not done yet")
    assert check_predict_peak_bytes(lambda c: c["hiden"]).startswith("your function raised KeyError")
    assert check_predict_peak_bytes(lambda c: None).startswith("your function returned None")


def test_the_calculator_is_not_the_answer():
    def calc(c):
        return training_memory(c["n_params"], c["layers"], c["hidden"], c["heads"], c["vocab"],
                               c["batch"], c["seq"])["total"]
    assert "without training_memory" in check_predict_peak_bytes(calc)


def test_every_diagnosis_is_one_line():
    assert all("\n" not in why for why, _ in WRONG_MODELS)
