"""Notebook 09's FSDP-by-hand exercise: the check passes the reference and names each typical
wrong answer in one line (all functions run in one group of 3 processes)."""
import pytest
import torch
import torch.distributed as dist

from source_code.sharding.own_fsdp_exercise import ExerciseFailed, check_reduce_grad, verdicts
from source_code.solutions.nb09_own_fsdp import reduce_grad


def all_reduce_then_slice(flat_grad):
    world, rank = dist.get_world_size(), dist.get_rank()
    c = -(-flat_grad.numel() // world)
    full = flat_grad.clone()
    dist.all_reduce(full)
    full = torch.cat([full / world, full.new_zeros(c * world - full.numel())])
    return full[rank * c:(rank + 1) * c]


def no_padding(flat_grad):
    world = dist.get_world_size()
    mine = flat_grad.new_empty(flat_grad.numel() // world)
    dist.reduce_scatter_tensor(mine, flat_grad)
    return mine / world


def floor_chunk(flat_grad):
    world = dist.get_world_size()
    c = flat_grad.numel() // world
    mine = flat_grad.new_empty(c)
    dist.reduce_scatter_tensor(mine, flat_grad[:c * world].contiguous())
    return mine / world


def the_sum(flat_grad):
    world = dist.get_world_size()
    c = -(-flat_grad.numel() // world)
    padded = torch.cat([flat_grad, flat_grad.new_zeros(c * world - flat_grad.numel())])
    mine = flat_grad.new_empty(c)
    dist.reduce_scatter_tensor(mine, padded)
    return mine


def the_whole_mean(flat_grad):
    full = flat_grad.clone()
    dist.all_reduce(full)
    return full / dist.get_world_size()


def garbage_padding(flat_grad):
    world = dist.get_world_size()
    c = -(-flat_grad.numel() // world)
    padded = torch.cat([flat_grad, flat_grad.new_ones(c * world - flat_grad.numel())])
    mine = flat_grad.new_empty(c)
    dist.reduce_scatter_tensor(mine, padded)
    return mine / world


WRONG = [(all_reduce_then_slice, "twice the bytes"), (no_padding, "not a multiple of 3"),
         (floor_chunk, "fell off"), (the_sum, "their mean"), (the_whole_mean, "only its own chunk"),
         (garbage_padding, "must be zeros")]


def test_reference_and_wrong_answers_in_one_group():
    got = verdicts([reduce_grad] + [fn for fn, _ in WRONG], world_size=3)
    assert got[0] is None, got[0]
    for (fn, says), verdict in zip(WRONG, got[1:]):
        assert verdict and says in verdict and "\n" not in verdict, (fn.__name__, verdict)


def test_one_line_for_a_wrong_answer_and_for_the_reference(capsys):
    def reduce_grad_todo(flat_grad):
        raise NotImplementedError
    assert check_reduce_grad(reduce_grad_todo) is False
    out = capsys.readouterr().out
    assert out.startswith("not done yet") and out.count("\n") == 1
    with pytest.raises(ExerciseFailed):
        check_reduce_grad(reduce_grad_todo, strict=True, quiet=True)
    assert capsys.readouterr().out == ""


def test_reference_on_two_ranks_prints_one_line(capsys):
    assert check_reduce_grad(reduce_grad, world_size=2)
    out = capsys.readouterr().out
    assert out.startswith("correct") and out.count("\n") == 1
