"""Reference solution of notebook 11's exercise: the operator behind a row-parallel layer and
its forward (tests/test_tensor_parallel_exercise.py runs the check with it and wrong answers)."""
from __future__ import annotations

import torch

from source_code.tensor_parallel.exercises import all_reduce


class ReferenceReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, partial):
        return all_reduce(partial)          # sum of the partial products

    @staticmethod
    def backward(ctx, grad):
        return grad                         # d(sum)/d(my summand) = 1: every rank has the grad


def reference_row_parallel_forward(x_local, w_local, bias, reduce=ReferenceReduceFromTP):
    partial = x_local @ w_local.T           # (b, t, out): my share of x @ W^T
    return reduce.apply(partial) + bias     # the bias once, after the sum
