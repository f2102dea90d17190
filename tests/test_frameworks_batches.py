"""How Accelerate's prepared loader shards an epoch, against the plain script's DistributedSampler
(source_code/frameworks/batches.py): counted on index datasets, one process, no training."""
import torch

from source_code.frameworks import batches


def test_plain_sampler_deals_every_example_once_with_a_short_last_step():
    runs = batches.plain_batches(10, 4, 2, seed=0, epochs=2)
    for epoch in runs:
        assert [len(s) for s in epoch[0]] == [2, 2, 1] == [len(s) for s in epoch[1]]
        assert sorted(i for rank in epoch for s in rank for i in s) == list(range(10))
    assert runs[0] != runs[1]                                # set_epoch: a new order


def test_accelerate_deals_whole_batches_and_fills_the_last_step_from_the_epoch_start():
    runs = batches.accelerate_batches(10, 4, 2, seed=0, epochs=2)
    for epoch in runs:
        steps = [s for step in zip(*epoch) for s in step]    # the batches in dealing order
        assert [len(s) for s in steps] == [2] * 6           # full batches: 12 for 10 examples
        assert set(i for s in steps for i in s) == set(range(10))
        order = [i for s in steps for i in s]
        assert order[10:] == order[:2]                      # the 2 extra are the epoch's first
    assert runs[0] != runs[1]                                # the generator carries on


def test_accelerate_uses_the_loaders_generator_and_process_r_takes_batches_r_r_plus_n():
    acc = batches.accelerate_batches(12, 4, 2, seed=3, epochs=1)[0]
    g = torch.Generator().manual_seed(3)
    torch.empty((), dtype=torch.int64).random_(generator=g)  # the loader's iterator draws a seed first
    order = torch.randperm(12, generator=g).tolist()          # then RandomSampler's permutation
    assert acc[0] == [order[0:2], order[4:6], order[8:10]]
    assert acc[1] == [order[2:4], order[6:8], order[10:12]]


def test_compare_on_the_digits_split():
    n, batch, world = 1438, 64, 2                            # the frameworks' default run
    got = batches.compare(batches.plain_batches(n, batch, world, 0, 2),
                          batches.accelerate_batches(n, batch, world, 0, 2))
    assert got["plain"] == {"steps_per_epoch": {23}, "examples_per_epoch": {n},
                            "distinct_per_epoch": {n}, "last_step": {n - 22 * batch}}
    assert got["accelerate"] == {"steps_per_epoch": {23}, "examples_per_epoch": {23 * batch},
                                 "distinct_per_epoch": {n}, "last_step": {batch}}
    assert got["steps"] == 46 and got["same_global_batches"] == 0


def test_compare_counts_equal_global_batches_as_sets():
    plain = batches.plain_batches(8, 4, 2, 0, 1)
    assert batches.compare(plain, plain)["same_global_batches"] == 2
    other = [[[list(reversed(s)) for s in rank] for rank in epoch] for epoch in plain]
    assert batches.compare(plain, other)["same_global_batches"] == 2   # a set per step: order within is free
    moved = [[rank[::-1] for rank in epoch] for epoch in plain]        # the steps swapped
    assert batches.compare(plain, moved)["same_global_batches"] == 0
