"""Notebook 04: the replica-step exercise check (reference passes, typical mistakes are named)
and the measured costs of DataParallel."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from source_code.solutions.nb04_dataparallel import replica_step
from source_code.training import dataparallel_costs as costs
from source_code.training.dataparallel_exercise import check_replica_step


def test_reference_solution_passes():
    assert check_replica_step(replica_step).startswith("correct")


def one_copy_at_a_time(module, x, y, n):
    """Right, written another way: each copy made, used and dropped before the next (Python may
    give the next copy the dropped one's id)."""
    for cx, cy in zip(x.chunk(n), y.chunk(n)):
        r = copy.deepcopy(module)
        (len(cx) / len(x) * F.cross_entropy(r(cx), cy)).backward()
        for p, c in zip(module.parameters(), r.parameters()):
            p.grad = c.grad if p.grad is None else p.grad + c.grad
        del r


def test_a_right_answer_that_drops_each_copy_before_the_next_passes():
    assert check_replica_step(one_copy_at_a_time).startswith("correct")


def the_module_itself_on_one_device(module, x, y, n):
    """Right, written another way: with one device DataParallel runs the module itself."""
    if n == 1:
        F.cross_entropy(module(x), y).backward()
    else:
        replica_step(module, x, y, n)


def test_the_module_itself_on_one_device_passes():
    assert check_replica_step(the_module_itself_on_one_device).startswith("correct")


def on_the_module_itself(module, x, y, n):
    for cx, cy in zip(x.chunk(n), y.chunk(n)):
        (len(cx) / len(x) * F.cross_entropy(module(cx), cy)).backward()


def unweighted_chunk_means(module, x, y, n):
    reps = [copy.deepcopy(module) for _ in x.chunk(n)]
    for r, cx, cy in zip(reps, x.chunk(n), y.chunk(n)):
        (F.cross_entropy(r(cx), cy) / n).backward()
    for p, *cs in zip(module.parameters(), *(r.parameters() for r in reps)):
        p.grad = sum(c.grad for c in cs)


def gradients_left_on_the_copies(module, x, y, n):
    reps = [copy.deepcopy(module) for _ in x.chunk(n)]
    for r, cx, cy in zip(reps, x.chunk(n), y.chunk(n)):
        (len(cx) / len(x) * F.cross_entropy(r(cx), cy)).backward()


def first_copy_only(module, x, y, n):
    reps = [copy.deepcopy(module) for _ in x.chunk(n)]
    for r, cx, cy in zip(reps, x.chunk(n), y.chunk(n)):
        (len(cx) / len(x) * F.cross_entropy(r(cx), cy)).backward()
    for p, c in zip(module.parameters(), reps[0].parameters()):
        p.grad = c.grad


@pytest.mark.parametrize("wrong, words", [
    (on_the_module_itself, "the module itself ran forward"),
    (unweighted_chunk_means, "how much does each chunk's mean weigh"),
    (gradients_left_on_the_copies, "grad is empty"),
    (first_copy_only, "gradient differs"),
])
def test_typical_mistakes_are_named(wrong, words):
    with pytest.raises(AssertionError, match=words):
        check_replica_step(wrong)


def test_costs_count_the_bytes_dataparallel_moves():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(10, 20), torch.nn.Linear(20, 4))
    rep = costs.replicate_cost(model, n_devices=4, repeats=3)
    assert rep["bytes"] == 3 * (10 * 20 + 20 + 20 * 4 + 4) * 4  # 3 other devices, float32
    gat = costs.gather_cost(model, torch.randn(16, 10), n_devices=4, repeats=3)
    assert gat["bytes"] == 12 * 4 * 4  # 3 of 4 chunks of 4 examples x 4 outputs travel
    assert rep["ms"] > 0 and gat["ms"] > 0


def test_same_work_decides_from_paired_cpu_times_one_disturbed_step_cannot_tip_it():
    plain = [0.080] * 10
    same = [0.081, 0.079, 0.080, 0.082, 0.079, 0.080, 0.081, 0.080, 0.079, 0.080]
    assert costs.same_work(same, plain)
    # one step of either variant slowed 5x by a neighbour: the verdict stands
    assert costs.same_work(same[:3] + [0.400] + same[4:], plain)
    assert costs.same_work(same, plain[:6] + [0.400] + plain[7:])
    # the machine gets busy after the first round and stays busy: both sides of every later pair slow alike,
    # where the fastest steps alone (0.080 against 0.160) would say twice the cost
    assert costs.same_work([same[0]] + [2 * t for t in same[1:]], plain[:1] + [0.160] * 9)
    # twice the work is told apart, even with one step of the plain module disturbed
    assert not costs.same_work([2 * t for t in same], plain)
    assert not costs.same_work([2 * t for t in same], plain[:6] + [0.400] + plain[7:])
    assert costs.paired_ratio([2.0, 3.0, 9.0], [1.0, 3.0, 1.0]) == 2.0


def test_interleaved_steps_rotate_the_order_and_keep_wall_and_cpu_times():
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4)
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    calls = []

    def recording(name):
        def forward(t):
            calls.append(name)
            return model(t)
        return forward

    steps = costs.interleaved_steps({n: recording(n) for n in "abc"}, model, x, y, rounds=5)
    rounds = [calls[i:i + 3] for i in range(0, len(calls), 3)]
    assert len(rounds) == 6 and all(sorted(r) == list("abc") for r in rounds)  # a warm-up round, then 5
    assert [r[0] for r in rounds] == list("abcabc")  # each variant runs first in turn
    assert all(len(v) == 5 and min(v) > 0 for v in steps["wall_s"].values())
    assert all(len(v) == 5 and min(v) >= 0 for v in steps["cpu_s"].values())
    assert steps["fastest_ms"] == {n: 1e3 * min(v) for n, v in steps["wall_s"].items()}
    assert steps["cpu_ratio"]["a"] == 1.0
