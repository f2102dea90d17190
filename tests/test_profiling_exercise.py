"""Notebook 12's exercise: the fixed global mean passes; the hanging and the wrong versions fail."""
import pytest

from source_code.solutions import nb12_profiling as solution
from source_code.profiling.exercises import check_global_mean


@pytest.mark.parity
def test_solution_passes():
    assert check_global_mean(solution.global_mean_loss).startswith("correct")


@pytest.mark.parity
def test_the_hang_is_caught_with_a_hint():
    with pytest.raises(AssertionError, match="hang: a rank waited 3 s"):
        check_global_mean(solution.global_mean_loss_broken, timeout_s=3)


def mean_of_means(loss_sum, count):  # no hang, but every rank weighs the same
    t = torch.tensor([loss_sum / max(count, 1), 1.0], dtype=torch.float64)  # noqa: F821
    dist.all_reduce(t)  # noqa: F821
    return (t[0] / t[1]).item()


@pytest.mark.parity
def test_mean_of_means_is_wrong():
    with pytest.raises(AssertionError, match="wrong value at step 0"):
        check_global_mean(mean_of_means)


def test_unfinished_answer_is_reported():
    def todo(loss_sum, count):
        raise NotImplementedError
    with pytest.raises(NotImplementedError, match="not done yet"):
        check_global_mean(todo)


def test_check_runs_on_the_cpu_with_gloo_on_every_machine(monkeypatch):
    from source_code.profiling import exercises
    seen = {}

    def fake_spawn(fn, world, *args, **kwargs):
        seen.update(kwargs)
        raise exercises.ProcessesFailed("rank 1: stopped")
    monkeypatch.setattr(exercises, "spawn", fake_spawn)
    with pytest.raises(AssertionError, match="failed on the processes"):
        check_global_mean(solution.global_mean_loss)
    assert seen["device"] == "cpu"
