"""Notebook 11's exercise: the reference row-parallel forward passes, typical wrong answers fail
with the hint that fits them."""
import functools

import pytest
import torch

from source_code.tensor_parallel import exercises
from source_code.solutions.nb11_tensor_parallel import ReferenceReduceFromTP, reference_row_parallel_forward
from source_code.tensor_parallel.exercises import all_reduce, check_row_parallel


def test_solution_passes():
    assert check_row_parallel(reference_row_parallel_forward).startswith("correct")


class AllReduceBothWays(torch.autograd.Function):  # the conjugate forgotten: sums in backward too
    @staticmethod
    def forward(ctx, partial):
        return all_reduce(partial)

    @staticmethod
    def backward(ctx, grad):
        return all_reduce(grad)


class NoReduce(torch.autograd.Function):  # forgets the all-reduce
    @staticmethod
    def forward(ctx, partial):
        return partial.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad


def bias_in_every_partial(x_local, w_local, bias):
    return ReferenceReduceFromTP.apply(x_local @ w_local.T + bias)


def reduce_outside_autograd(x_local, w_local, bias):
    return all_reduce(x_local @ w_local.T) + bias


def only_rank0_reduces(x_local, w_local, bias):
    partial = x_local @ w_local.T
    return (ReferenceReduceFromTP.apply(partial) if exercises._tls.rank == 0 else partial) + bias


@pytest.mark.parametrize("wrong, message", [
    (functools.partial(reference_row_parallel_forward, reduce=NoReduce), "partial product"),
    (functools.partial(reference_row_parallel_forward, reduce=AllReduceBothWays), "times too large"),
    (bias_in_every_partial, "bias appears"),
    (reduce_outside_autograd, "no gradient reached"),
    (only_rank0_reduces, "did not meet"),
])
def test_wrong_answers_fail(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_row_parallel(wrong)


def test_unfinished_answer_is_reported():
    def todo(x_local, w_local, bias):
        raise NotImplementedError
    with pytest.raises(NotImplementedError, match="not done yet"):
        check_row_parallel(todo)
