"""Notebook 09's FSDP-by-hand exercises: each check passes the reference and names each typical
wrong answer in its own line (every function of both exercises runs in one group of 3
processes)."""
import pytest
import torch
import torch.distributed as dist

from source_code.sharding import own_fsdp_exercise
from source_code.sharding.own_fsdp_exercise import (ExerciseFailed, all_verdicts, check_both,
                                                    check_reduce_grad, check_zero3_core, reduce_grad_passed)
from source_code.sharding.own_fsdp_core_exercise import free_storage, gather
from source_code.solutions.nb09_own_fsdp import after_forward, reduce_grad, unshard


def all_reduce_then_slice(flat_grad):
    flat_grad = flat_grad.float()
    world, rank = dist.get_world_size(), dist.get_rank()
    c = -(-flat_grad.numel() // world)
    full = flat_grad.clone()
    dist.all_reduce(full)
    full = torch.cat([full / world, full.new_zeros(c * world - full.numel())])
    return full[rank * c:(rank + 1) * c]


def no_padding(flat_grad):
    flat_grad = flat_grad.float()
    world = dist.get_world_size()
    mine = flat_grad.new_empty(flat_grad.numel() // world)
    dist.reduce_scatter_tensor(mine, flat_grad)
    return mine / world


def floor_chunk(flat_grad):
    flat_grad = flat_grad.float()
    world = dist.get_world_size()
    c = flat_grad.numel() // world
    mine = flat_grad.new_empty(c)
    dist.reduce_scatter_tensor(mine, flat_grad[:c * world].contiguous())
    return mine / world


def the_sum(flat_grad):
    flat_grad = flat_grad.float()
    world = dist.get_world_size()
    c = -(-flat_grad.numel() // world)
    padded = torch.cat([flat_grad, flat_grad.new_zeros(c * world - flat_grad.numel())])
    mine = flat_grad.new_empty(c)
    dist.reduce_scatter_tensor(mine, padded)
    return mine


def the_whole_mean(flat_grad):
    flat_grad = flat_grad.float()
    full = flat_grad.clone()
    dist.all_reduce(full)
    return full / dist.get_world_size()


def garbage_padding(flat_grad):
    flat_grad = flat_grad.float()
    world = dist.get_world_size()
    c = -(-flat_grad.numel() // world)
    padded = torch.cat([flat_grad, flat_grad.new_ones(c * world - flat_grad.numel())])
    mine = flat_grad.new_empty(c)
    dist.reduce_scatter_tensor(mine, padded)
    return mine / world


def added_in_bf16(flat_grad):                      # comm.py's helper, on the bf16 gradient
    world = dist.get_world_size()
    c = -(-flat_grad.numel() // world)
    padded = torch.cat([flat_grad, flat_grad.new_zeros(c * world - flat_grad.numel())])
    mine = flat_grad.new_empty(c)
    dist.reduce_scatter_tensor(mine, padded)
    return mine.div_(world)


def cast_after_the_wire(flat_grad):               # fp32 out, but the sums rounded in bf16
    world = dist.get_world_size()
    c = -(-flat_grad.numel() // world)
    padded = torch.cat([flat_grad, flat_grad.new_zeros(c * world - flat_grad.numel())])
    mine = flat_grad.new_empty(c)
    dist.reduce_scatter_tensor(mine, padded)
    return mine.float() / world


def divided_before_the_cast(flat_grad):          # fp32 sums, but each term rounded in bf16 first
    world, rank = dist.get_world_size(), dist.get_rank()
    c = -(-flat_grad.numel() // world)
    grad = (flat_grad / world).float()
    padded = torch.cat([grad, grad.new_zeros(c * world - grad.numel())])
    mine = padded.new_empty(c)
    dist.reduce_scatter_tensor(mine, padded)
    return mine


def all_gather_then_sum(flat_grad):               # every rank receives every rank's whole gradient
    world, rank = dist.get_world_size(), dist.get_rank()
    c = -(-flat_grad.numel() // world)
    grad = torch.cat([flat_grad.float(), flat_grad.new_zeros(c * world - flat_grad.numel()).float()])
    every = [torch.empty_like(grad) for _ in range(world)]
    dist.all_gather(every, grad)
    return sum(g[rank * c:(rank + 1) * c] for g in every) / world


def reduce_scatter_and_all_reduce(flat_grad):     # the right chunk, but the whole sum received too
    world = dist.get_world_size()
    c = -(-flat_grad.numel() // world)
    grad = torch.cat([flat_grad.float(), flat_grad.new_zeros(c * world - flat_grad.numel()).float()])
    dist.all_reduce(grad.clone())
    mine = grad.new_empty(c)
    dist.reduce_scatter_tensor(mine, grad)
    return mine / dist.get_world_size()


def reduce_scatter_and_all_gather(flat_grad):     # the right chunk, and every rank's gradient besides
    world = dist.get_world_size()
    c = -(-flat_grad.numel() // world)
    grad = torch.cat([flat_grad.float(), flat_grad.new_zeros(c * world - flat_grad.numel()).float()])
    dist.all_gather([torch.empty_like(grad) for _ in range(world)], grad)
    mine = grad.new_empty(c)
    dist.reduce_scatter_tensor(mine, grad)
    return mine / dist.get_world_size()


def all_to_all_then_sum(flat_grad):               # right, written another way: the same bytes
    world = dist.get_world_size()
    c = -(-flat_grad.numel() // world)
    grad = torch.cat([flat_grad.float(), flat_grad.new_zeros(c * world - flat_grad.numel()).float()])
    pieces = torch.empty_like(grad)                # (N * c,): every rank's copy of my chunk
    dist.all_to_all_single(pieces, grad)
    return pieces.view(world, c).sum(0) / world


def averaged_by_the_backend(flat_grad):          # right on NCCL (FSDP2's way there); gloo only sums
    flat_grad = flat_grad.float()
    world = dist.get_world_size()
    c = -(-flat_grad.numel() // world)
    padded = torch.cat([flat_grad, flat_grad.new_zeros(c * world - flat_grad.numel())])
    mine = flat_grad.new_empty(c)
    dist.reduce_scatter_tensor(mine, padded, op=dist.ReduceOp.AVG)
    return mine


RIGHT_REDUCE = [all_to_all_then_sum]

WRONG_REDUCE = [(added_in_bf16, "is torch.bfloat16"), (cast_after_the_wire, "added in bf16"),
                (divided_before_the_cast, "divided by N in bf16"),
                (all_gather_then_sum, "sent with all_gather"), (all_reduce_then_slice, "sent with all_reduce"), (no_padding, "not a multiple of 3"),
                (floor_chunk, "fell off"), (the_sum, "their mean"), (the_whole_mean, "only its own chunk"),
                (garbage_padding, "must be zeros"), (averaged_by_the_backend, "ReduceOp.AVG on gloo needs torch 2.8"),
                (reduce_scatter_and_all_reduce, "all_reduce, reduce_scatter_tensor: this rank received"),
                (reduce_scatter_and_all_gather, "all_gather, reduce_scatter_tensor: this rank received")]


# the ZeRO-3 core: the unit's two forward hooks
def frees_before_computing(unit):
    gather(unit)
    free_storage(unit.full)


def gathers_nothing(unit):
    pass


def keeps_them(unit, out):
    return out


def never_regathers(unit, out):
    free_storage(unit.full)
    return out


def regathers_with_the_gradient(unit, out):      # after the unit's backward has read them
    free_storage(unit.full)
    unit.full.register_post_accumulate_grad_hook(lambda full: gather(unit))
    return out


def regathers_after_the_module(unit, out):       # a module backward hook: after its backward
    free_storage(unit.full)
    unit.module.register_full_backward_hook(lambda module, grad_in, grad_out: gather(unit))
    return out


def regathers_with_a_module_pre_hook(unit, out):  # registered during the call: from the next one on
    free_storage(unit.full)
    unit.module.register_full_backward_pre_hook(lambda module, grad_out: gather(unit))
    return out


def regathers_at_once(unit, out):                # whole from forward to backward
    free_storage(unit.full)
    gather(unit)
    return out


def remembers_every_unit(unit):
    globals().setdefault("every_unit", {})[unit.name] = unit   # (the check runs the source in a namespace)
    gather(unit)


def regathers_everything(unit, out):             # the whole model again at the first backward hook
    free_storage(unit.full)

    def everything(grad):
        for other in globals()["every_unit"].values():
            gather(other)
    out.register_hook(everything)
    return out


# right answers written another way: gather again when the backward unpacks what autograd saved
# (embeddings, whose backward reads no weight, are then never gathered again), or in a pre-hook
# of the autograd node that made the unit's output
def unshard_with_saved_hooks(unit):
    gather(unit)

    def unpack(t):
        if unit.full.untyped_storage().nbytes() == 0:
            gather(unit)
        return t
    unit.saving = torch.autograd.graph.saved_tensors_hooks(lambda t: t, unpack)
    unit.saving.__enter__()


def frees_leaving_unpack_to_gather(unit, out):
    unit.saving.__exit__(None, None, None)
    free_storage(unit.full)
    return out


def regathers_before_the_output_node(unit, out):  # a pre-hook on the node that made the output
    free_storage(unit.full)
    out.grad_fn.register_prehook(lambda grad_outputs: gather(unit))
    return out


RIGHT_CORE = [(unshard_with_saved_hooks, frees_leaving_unpack_to_gather),
              (unshard, regathers_before_the_output_node)]

WRONG_CORE = [((frees_before_computing, after_forward), "freed it before the unit used it"),
              ((gathers_nothing, after_forward), "with nothing gathered"),
              ((unshard, keeps_them), "still holds its full parameters after its forward"),
              ((unshard, never_regathers), "nothing gathered them again"),
              ((unshard, regathers_with_the_gradient), "only after its backward had read"),
              ((unshard, regathers_after_the_module), "only after its backward had read"),
              ((unshard, regathers_with_a_module_pre_hook), "only in a later step"),
              ((unshard, regathers_at_once), "still holds its full parameters after its forward"),
              ((remembers_every_unit, regathers_everything), "more than 2 units held their full")]


def test_references_and_wrong_answers_in_one_group():
    got_reduce, got_core = all_verdicts([reduce_grad] + RIGHT_REDUCE + [fn for fn, _ in WRONG_REDUCE],
                                        [(unshard, after_forward)] + RIGHT_CORE
                                        + [pair for pair, _ in WRONG_CORE], world_size=3)
    assert got_reduce[0] is None and got_core[0] is None, (got_reduce[0], got_core[0])
    right = got_core[1:1 + len(RIGHT_CORE)]
    assert right == [None] * len(RIGHT_CORE), right     # correct answers written another way
    assert got_reduce[1:1 + len(RIGHT_REDUCE)] == [None] * len(RIGHT_REDUCE), got_reduce
    got_core, got_reduce = got_core[len(RIGHT_CORE):], got_reduce[len(RIGHT_REDUCE):]
    for (fn, says), verdict in zip(WRONG_REDUCE, got_reduce[1:]):
        assert verdict and says in verdict and "\n" not in verdict, (fn.__name__, verdict)
    for ((a, b), says), verdict in zip(WRONG_CORE, got_core[1:]):
        assert verdict and says in verdict and "\n" not in verdict, (a.__name__, b.__name__, verdict)


def test_one_line_for_a_todo(capsys):
    def reduce_grad_todo(flat_grad):
        raise NotImplementedError

    def after_forward_todo(unit, out):
        raise NotImplementedError
    assert check_reduce_grad(reduce_grad_todo) is False
    assert check_zero3_core(unshard, after_forward_todo) is False
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and all(line.startswith("not done yet") for line in out), out
    with pytest.raises(ExerciseFailed):
        check_reduce_grad(reduce_grad_todo, strict=True, quiet=True)
    assert capsys.readouterr().out == ""


def test_references_on_two_ranks_print_one_line_each(capsys):
    assert check_both(reduce_grad, unshard, after_forward, world_size=2)
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and all(line.startswith("correct") for line in out), out


def test_only_a_passed_reduce_grad_check_reveals_the_hooks(monkeypatch, capsys):
    """Notebook 09 prints the lesson's gradient hooks (exercise 2's answer) once
    reduce_grad_passed(): set by check_reduce_grad passing, not by the other exercise's check,
    nor by the reference cell's check_both, nor by a failed try (no processes: verdicts faked)."""
    monkeypatch.setattr(own_fsdp_exercise, "_REDUCE_PASSED", [])
    monkeypatch.setattr(own_fsdp_exercise, "all_verdicts", lambda fns=(), pairs=(), world_size=3: (
        [None] * len(fns), [None] * len(pairs)))
    assert check_zero3_core(unshard, after_forward) and check_both(reduce_grad, unshard, after_forward)
    assert not reduce_grad_passed()
    monkeypatch.setattr(own_fsdp_exercise, "verdicts", lambda fns, world_size=3: ["wrong"])
    assert not check_reduce_grad(reduce_grad) and not reduce_grad_passed()
    monkeypatch.setattr(own_fsdp_exercise, "verdicts", lambda fns, world_size=3: [None])
    assert check_reduce_grad(reduce_grad) and reduce_grad_passed()
    capsys.readouterr()
