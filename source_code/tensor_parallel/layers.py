"""Column- and row-parallel linear layers, each cut from a dense ``nn.Linear``.

A linear layer y = x @ W^T + b with W of shape (out, in) can be split two ways over n ranks:

* column-parallel: rank r keeps rows r*out/n ... of W (and of b), i.e. a slice of the OUTPUT
  features. Input: the full x on every rank (``copy_to_tp`` in front); output: my slice of y.
* row-parallel: rank r keeps columns r*in/n ... of W, i.e. a slice of the INPUT features.
  Input: my slice of x (exactly what a column-parallel layer produced); output: a partial
  sum that ``reduce_from_tp`` all-reduces; the bias is added once, after the sum.

Column then row needs no communication in between: the MLP's GELU, and attention per head,
work on the slices as they are. ``sequence_parallel=True`` swaps the border operators for
their sequence-parallel versions (all-gather in, reduce-scatter out). A sequence-parallel
column layer is one autograd function, ``_SPColumnLinears`` (Megatron-LM's way): it keeps the
input SHARD (b, t/n, in) for backward, not the gathered (b, t, in), and all-gathers it again
in backward for the weight gradient: n times less memory for the input, one more all-gather.

Parameters are sliced copies of the dense layer's, so parity with the dense model can be
checked; ``owner`` on each parameter says which rows or columns of the dense matrix it holds.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from source_code.tensor_parallel import comm


def shard_range(size: int, rank: int, world: int) -> tuple[int, int]:
    """[start, stop) of rank's equal slice of ``size`` (which must divide by world)."""
    if size % world:
        raise ValueError(f"{size} features do not split evenly over {world} ranks")
    step = size // world
    return rank * step, (rank + 1) * step


class _SPColumnLinears(torch.autograd.Function):
    """Sequence-parallel column-parallel linear(s) y_i = gather(x) @ W_i^T + b_i.

    Forward all-gathers x along t; autograd would then keep the gathered (b, t, in) for the
    weight gradient. This function saves the shard (b, t/n, in) instead and all-gathers it
    again in backward. Several layers reading the same x (q, k, v) share the gathers and the
    one reduce-scatter of dL/dx."""

    @staticmethod
    def forward(ctx, x, tag, *params):           # x: (b, t/n, in); params: w_1, b_1, w_2, b_2, ...
        weights, biases = params[0::2], params[1::2]
        full = comm.all_gather_seq(x, "forward", tag)                       # (b, t, in)
        ctx.tag, ctx.has_bias = tag, [b is not None for b in biases]
        ctx.save_for_backward(x, *weights)       # the shard, not ``full``: freed after forward
        return tuple(F.linear(full, w, b) for w, b in zip(weights, biases))  # (b, t, out_i/n)

    @staticmethod
    def backward(ctx, *grads):                   # grads: (b, t, out_i/n)
        x, *weights = ctx.saved_tensors
        full = comm.all_gather_seq(x, "backward", f"{ctx.tag}.again")      # (b, t, in) once more
        grad_full = sum(g @ w for g, w in zip(grads, weights))             # (b, t, in): my share
        grad_x = comm.reduce_scatter_seq(grad_full, "backward", ctx.tag)   # (b, t/n, in), summed
        flat_x = full.flatten(0, -2)                                       # (b*t, in)
        out = []
        for g, has_bias in zip(grads, ctx.has_bias):
            g = g.flatten(0, -2)                                           # (b*t, out_i/n)
            out += [g.T @ flat_x, g.sum(0) if has_bias else None]          # dW_i, db_i
        return (grad_x, None, *out)


def sp_column_linears(x, linears, tag: str = "") -> tuple:
    """(b, t/n, in) -> one (b, t, out_i/n) output per ColumnParallelLinear of ``linears``."""
    return _SPColumnLinears.apply(x, tag, *(p for m in linears for p in (m.weight, m.bias)))


class ColumnParallelLinear(nn.Module):
    """y_r = x @ W_r^T + b_r with W_r = W[rows of rank r]: full input, my slice of the output."""

    def __init__(self, dense: nn.Linear, rank: int, world: int, sequence_parallel: bool = False,
                 tag: str = ""):
        super().__init__()
        lo, hi = shard_range(dense.out_features, rank, world)
        self.weight = nn.Parameter(dense.weight.detach()[lo:hi].clone())          # (out/n, in)
        self.bias = (nn.Parameter(dense.bias.detach()[lo:hi].clone())
                     if dense.bias is not None else None)                       # (out/n,)
        self.weight.owner = ("rows", lo, hi)
        if self.bias is not None:
            self.bias.owner = ("rows", lo, hi)
        self.sequence_parallel, self.tag = sequence_parallel, tag

    def forward(self, x):                     # x: (b, t, in) TP, (b, t/n, in) SP
        if self.sequence_parallel:            # all-gather, keep the shard; backward: all-gather
            return sp_column_linears(x, [self], self.tag)[0]   # again, then reduce-scatter
        x = comm.copy_to_tp(x, self.tag)      # (b, t, in); backward: all-reduce
        return F.linear(x, self.weight, self.bias)  # (b, t, out/n)


class RowParallelLinear(nn.Module):
    """y = sum_r x_r @ W_r^T + b with W_r = W[:, columns of rank r]: my input slice, full output."""

    def __init__(self, dense: nn.Linear, rank: int, world: int, sequence_parallel: bool = False,
                 tag: str = ""):
        super().__init__()
        lo, hi = shard_range(dense.in_features, rank, world)
        self.weight = nn.Parameter(dense.weight.detach()[:, lo:hi].clone())       # (out, in/n)
        self.bias = (nn.Parameter(dense.bias.detach().clone())
                     if dense.bias is not None else None)                       # (out,) replicated
        self.weight.owner = ("columns", lo, hi)
        self.sequence_parallel, self.tag = sequence_parallel, tag

    def forward(self, x):                     # x: (b, t, in/n)
        partial = F.linear(x, self.weight)    # (b, t, out): this rank's share of the sum
        if self.sequence_parallel:
            y = comm.reduce_scatter_to_sp(partial, self.tag)  # (b, t/n, out); backward: all-gather
        else:
            y = comm.reduce_from_tp(partial, self.tag)        # (b, t, out); backward: identity
        return y if self.bias is None else y + self.bias      # the bias once, after the sum
