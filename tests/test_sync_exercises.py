"""The exercises of notebooks 02 and 03: their checks pass the reference solutions and reject
typical wrong answers (functions defined at module level, as a notebook cell defines them)."""
import pytest
import torch

from source_code.solutions.nb02_sync import all_gather_phase as ring_solution
from source_code.solutions.nb03_collectives import p2p_all_gather
from source_code.sync.exercises import check_all_gather, check_p2p_all_gather


# --------------------------------------------------------------------------- notebook 02
def test_ring_all_gather_solution_passes_the_check():
    assert check_all_gather(ring_solution) is True


def test_unfinished_ring_all_gather_reports_not_done(capsys):
    def todo(chunks, rank, world, exchange):
        raise NotImplementedError
    assert check_all_gather(todo) is False
    assert "not done yet" in capsys.readouterr().out


@pytest.mark.parametrize("wrong", ["one_step_short", "wrong_chunk", "whole_buffer"])
def test_wrong_ring_all_gathers_fail_the_check(wrong):
    def answer(chunks, rank, world, exchange):
        if wrong == "one_step_short":
            for s in range(world - 2):
                exchange(chunks[(rank + 1 - s) % world], chunks[(rank - s) % world])
        elif wrong == "wrong_chunk":  # forwards a partial chunk instead of the complete one
            for s in range(world - 1):
                exchange(chunks[(rank - s) % world], chunks[(rank - 1 - s) % world])
        else:
            buf = torch.cat(chunks)
            for _ in range(world - 1):
                exchange(buf, buf.clone())
    with pytest.raises(AssertionError):
        check_all_gather(answer, timeout=2.0)


# --------------------------------------------------------------------------- notebook 03
# The check sends a function's *source* to the processes: these answers must be self-contained.
def todo_p2p(output, x):
    raise NotImplementedError


def forgets_own_piece(output, x):
    rank, world = dist.get_rank(), dist.get_world_size()
    slots = output.chunk(world)
    ops = []
    for peer in range(world):
        if peer != rank:
            ops.append(dist.P2POp(dist.isend, x, peer))
            ops.append(dist.P2POp(dist.irecv, slots[peer], peer))
    for work in dist.batch_isend_irecv(ops):
        work.wait()


def pieces_in_wrong_slots(output, x):
    rank, world = dist.get_rank(), dist.get_world_size()
    slots = output.chunk(world)
    slots[rank].copy_(x)
    ops = []
    for peer in range(world):
        if peer != rank:
            ops.append(dist.P2POp(dist.isend, x, peer))
            ops.append(dist.P2POp(dist.irecv, slots[(peer + 1) % world if (peer + 1) % world != rank else peer], peer))
    for work in dist.batch_isend_irecv(ops):
        work.wait()


def uses_the_collective(output, x):
    dist.all_gather_into_tensor(output, x)


def test_p2p_all_gather_solution_passes_the_check():
    assert check_p2p_all_gather(p2p_all_gather) is True


def test_unfinished_p2p_all_gather_reports_not_done(capsys):
    assert check_p2p_all_gather(todo_p2p) is False
    assert "not done yet" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, says", [(forgets_own_piece, "expected"), (pieces_in_wrong_slots, "expected"),
                                         (uses_the_collective, "not allowed")])
def test_wrong_p2p_all_gathers_fail_the_check(wrong, says):
    with pytest.raises(AssertionError, match=says):
        check_p2p_all_gather(wrong)


import torch.distributed as dist  # noqa: E402 (the answers above read it as a notebook cell would)
