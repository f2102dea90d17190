"""Column- and row-parallel linear layers, each cut from a dense ``nn.Linear``.

A linear layer y = x @ W^T + b with W of shape (out, in) can be split two ways over n ranks:

* column-parallel: rank r keeps rows r*out/n ... of W (and of b), i.e. a slice of the OUTPUT
  features. Input: the full x on every rank (``copy_to_tp`` in front); output: my slice of y.
* row-parallel: rank r keeps columns r*in/n ... of W, i.e. a slice of the INPUT features.
  Input: my slice of x (exactly what a column-parallel layer produced); output: a partial
  sum that ``reduce_from_tp`` all-reduces; the bias is added once, after the sum.

Column then row needs no communication in between: the MLP's GELU, and attention per head,
work on the slices as they are. ``sequence_parallel=True`` swaps the border operators for
their sequence-parallel versions (all-gather in, reduce-scatter out).

Parameters are sliced copies of the dense layer's, so parity with the dense model can be
checked; ``owner`` on each parameter says which rows or columns of the dense matrix it holds.
"""
from __future__ import annotations

import torch.nn as nn
import torch.nn.functional as F

from source_code.tensor_parallel import comm


def shard_range(size: int, rank: int, world: int) -> tuple[int, int]:
    """[start, stop) of rank's equal slice of ``size`` (which must divide by world)."""
    if size % world:
        raise ValueError(f"{size} features do not split evenly over {world} ranks")
    step = size // world
    return rank * step, (rank + 1) * step


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
        if self.sequence_parallel:
            x = comm.gather_from_sp(x, self.tag)   # (b, t, in); backward: reduce-scatter
        else:
            x = comm.copy_to_tp(x, self.tag)       # (b, t, in); backward: all-reduce
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
