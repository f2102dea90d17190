"""Notebook 05's exercises: the reference solutions pass their check functions, wrong answers fail."""
import pytest
import torch
import torch.distributed as dist

from source_code.ddp_internals.exercises import check_average_gradients, check_shard
from source_code.solutions import nb05_ddp


def test_shard_solution_passes():
    assert check_shard(nb05_ddp.shard).startswith("correct")


def _shard_without_padding(n, world_size, rank, epoch, seed):
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
    return order[rank::world_size]  # uneven shards: ranks would run different step counts


def _shard_ignoring_epoch(n, world_size, rank, epoch, seed):
    return nb05_ddp.shard(n, world_size, rank, 0, seed)  # the same order every epoch


@pytest.mark.parametrize("wrong", [_shard_without_padding, _shard_ignoring_epoch])
def test_wrong_shard_fails(wrong):
    with pytest.raises(AssertionError, match="DistributedSampler gives"):
        check_shard(wrong)


def test_average_gradients_solution_passes():
    assert check_average_gradients(nb05_ddp.average_gradients).startswith("correct")


def summed_gradients(model):
    for p in model.parameters():
        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)  # forgets to divide by the world size


def test_summed_gradients_fail():
    with pytest.raises(AssertionError, match="differ from the full-batch gradient"):
        check_average_gradients(summed_gradients)


def not_done(model):
    raise NotImplementedError


def test_unfinished_answer_is_reported_without_starting_processes():
    with pytest.raises(NotImplementedError, match="not done yet"):
        check_average_gradients(not_done)
