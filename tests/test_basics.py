"""Notebooks 00/01's code: shard-gradient identity, ping-pong fit, the exercise, warmup, batch sizes."""
import math

import numpy as np
import pytest
import torch

from source_code.basics import pingpong, sgd_theory
from source_code.basics.shard_exercise import ExerciseFailed, check_combine
from source_code.solutions.nb01_sgd import combine_shard_gradients


@pytest.mark.parametrize("n_shards", [1, 2, 4, 8])
def test_mean_of_equal_shard_gradients_is_the_batch_gradient(n_shards):
    assert sgd_theory.shard_identity(n_shards) < 1e-12


def test_plain_mean_of_uneven_shards_is_not_the_batch_gradient():
    # the identity needs equal shards: with 200 + 56 examples the plain mean is measurably off
    w, x, y = sgd_theory.problem_batch(256)
    grads, sizes = sgd_theory.shard_gradients(w, x, y, 2, [200, 56])
    gap = (torch.stack(grads).mean(0) - sgd_theory.gradient(w, x, y)).abs().max().item()
    assert gap > 1e-3


def test_uneven_split_without_sizes_is_a_clear_error():
    w, x, y = sgd_theory.problem_batch(10)
    with pytest.raises(ValueError, match="equal shards"):
        sgd_theory.shard_gradients(w, x, y, 3)


@pytest.mark.parity
def test_all_reduce_average_over_two_processes_is_the_batch_gradient():
    assert sgd_theory.averaged_gradient_across_processes(2, batch=64) < 1e-12


def test_accumulation_gives_the_global_batch_gradient():
    assert sgd_theory.global_batch_size(32, 2, 4) == 256
    assert sgd_theory.accumulation_gap(8, 2, 4) < 1e-12
    with pytest.raises(ValueError, match="world_size must be a positive integer"):
        sgd_theory.global_batch_size(32, 0)


def test_exercise_solution_passes_the_check():
    assert check_combine(combine_shard_gradients, strict=True)


@pytest.mark.parametrize("wrong", [
    lambda grads, sizes: torch.stack(grads).mean(0),        # right for equal shards only
    lambda grads, sizes: sum(grads),                         # sum, not mean
    lambda grads, sizes: sum(n * g for n, g in zip(sizes, grads)),  # forgets the division
])
def test_wrong_answers_fail_the_check(wrong):
    with pytest.raises(ExerciseFailed):
        check_combine(wrong, strict=True)
    assert check_combine(wrong) is False


def test_unfinished_exercise_is_reported_not_crashing(capsys):
    def todo(grads, sizes):
        raise NotImplementedError
    assert check_combine(todo) is False
    assert "TODO" in capsys.readouterr().out


def test_warmup_schedule():
    lr, warm = 0.8, 4
    assert [sgd_theory.warmup_lr(s, lr, warm) for s in range(1, 7)] == pytest.approx(
        [0.2, 0.4, 0.6, 0.8, 0.8, 0.8])
    assert sgd_theory.warmup_lr(1, lr, 0) == lr
    with pytest.raises(ValueError, match="steps count from 1"):
        sgd_theory.warmup_lr(0, lr, warm)


def test_warmup_is_applied_in_training():
    # one update of batch 1438 (GD): with 4 warmup steps the step is a quarter as large, so the
    # weights after it are a quarter of the unwarmed ones -> the loss drops less
    plain = sgd_theory.train(1438, 1.0, 1)
    warm = sgd_theory.train(1438, 1.0, 1, warmup_steps=4)
    assert plain["loss"][0] == warm["loss"][0] == pytest.approx(math.log(10))
    assert plain["final_loss"] < warm["final_loss"] < warm["loss"][0]


def test_fit_recovers_a_known_alpha_beta():
    n = np.array([8, 1024, 2**20, 2**24], dtype=float)
    alpha, beta = pingpong.fit_alpha_beta(n, 50e-6 + n / 2e9)
    assert alpha == pytest.approx(50e-6, rel=1e-6) and beta == pytest.approx(2e9, rel=1e-6)


def test_pingpong_two_processes_sane():
    sizes = [8, 64, 2**20, 4 * 2**20]
    results = pingpong.run_spawned(2, sizes, iters=10)
    assert [r["bytes"] for r in results] == sizes
    assert all(0 < r["one_way_s"] <= r["one_way_median_s"] for r in results)
    alpha, beta = pingpong.fit_alpha_beta(sizes, [r["one_way_s"] for r in results])
    assert pingpong.sanity(results, alpha, beta) == []


def test_pingpong_bad_sizes_is_a_clear_error():
    with pytest.raises(SystemExit, match="at least two positive sizes"):
        pingpong.main(["--sizes", "8"])
    with pytest.raises(SystemExit, match="bytes separated by commas"):
        pingpong.main(["--sizes", "8,1k"])


def test_runs_share_one_clock_from_their_update_counts():
    per_update = sgd_theory.update_seconds([32, 1], rounds=3, per_round=2)
    assert set(per_update) == {32, 1} and all(t > 0 for t in per_update.values())
    h = {"updates": [0, 1, 10], "loss": [2.0, 1.5, 1.0], "seconds": [0.0, 0.3, 0.1]}
    timed = sgd_theory.on_clock(h, 0.5)
    assert timed["seconds"] == [0.0, 0.5, 5.0] and timed["loss"] == h["loss"] and h["seconds"][1] == 0.3
    assert sgd_theory.loss_at_seconds(timed, 4.9) == 1.5
