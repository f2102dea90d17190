"""Notebook 15's exercise: the slow run's diagnosis. The reference solution passes; the typical
wrong answers (the model's computation, the host sync, a fix that does not move the loading, a
fix that removes work) fail with a hint; a TODO says the exercise is not done."""
import pytest

from source_code.profiling import exercises, slow_run
from source_code.profiling.exercises import check_diagnosis
from source_code.solutions import nb15_bottleneck as solution


@pytest.fixture(scope="module")
def profile():
    return slow_run.run(steps=4, warmup=2, profile_steps=True)


def test_the_profile_holds_the_evidence(profile):
    ev = exercises.evidence(profile)
    assert ev["loader_ms"] > 0.5 * ev["step_ms"], ev        # the DataLoader's span: most of a step
    assert ev["conv_calls"] > 100 and ev["item_ms"] < 0.05 * ev["step_ms"], ev


def test_solution_passes(profile):
    msg = check_diagnosis(solution.bottleneck, solution.fix, profile)
    assert msg.startswith("correct: data loading")


@pytest.mark.parametrize("wrong, hint", [("computation", "not the model: aten::mkldnn_convolution runs"),
                                         ("host sync", "not here: aten::item takes")])
def test_wrong_diagnoses_are_caught_with_the_profiles_numbers(profile, wrong, hint):
    with pytest.raises(AssertionError, match=hint):
        check_diagnosis(wrong, solution.fix, profile)


def test_a_fix_that_does_not_move_the_loading_is_measured_and_caught(profile):
    with pytest.raises(AssertionError, match="right diagnosis, but the fix"):
        check_diagnosis("data loading", {"item_every": 10}, profile)


@pytest.mark.parametrize("fix, match", [({"decode_rounds": 0}, "not how much work"), ({}, "now the fix")])
def test_a_fix_must_keep_the_work_and_exist(profile, fix, match):
    with pytest.raises(AssertionError, match=match):
        check_diagnosis("data loading", fix, profile)


def test_unfinished_or_unknown_answers(profile):
    with pytest.raises(NotImplementedError, match="not done yet"):
        check_diagnosis("TODO", {}, profile)
    with pytest.raises(AssertionError, match="not one of the suspects"):
        check_diagnosis("the network", {}, profile)
