"""Notebook 00's exercise check: the reference round trip passes; typical wrong ones are named
(a deadlock ends after the timeout instead of hanging the notebook)."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from source_code.basics.pingpong_exercise import check_round_trip
from source_code.solutions.nb00_pingpong import round_trip


def test_reference_solution_passes():
    assert check_round_trip(round_trip).startswith("correct")


def both_receive_first(buf, rank):
    dist.recv(buf, src=1 - rank)
    dist.send(buf, dst=1 - rank)


def answers_with_a_new_tensor(buf, rank):
    if rank == 0:
        dist.send(buf, dst=1)
        dist.recv(buf, src=1)
    else:
        dist.recv(buf, src=0)
        dist.send(torch.zeros_like(buf), dst=0)


def receives_into_a_copy(buf, rank):
    if rank == 0:
        dist.send(buf, dst=1)
        dist.recv(buf, src=1)
    else:
        got = buf.clone()
        dist.recv(got, src=0)
        dist.send(got, dst=0)


def not_done(buf, rank):
    raise NotImplementedError


@pytest.mark.parametrize("wrong, words", [
    (both_receive_first, "waited for each other"),
    (answers_with_a_new_tensor, "did not get its message back"),
    (receives_into_a_copy, "did not receive rank 0's message into buf"),
])
def test_typical_wrong_answers_are_named(wrong, words):
    with pytest.raises(AssertionError, match=words):
        check_round_trip(wrong, timeout=6)


def test_not_done_yet_says_so():
    with pytest.raises(NotImplementedError, match="not done yet"):
        check_round_trip(not_done)
