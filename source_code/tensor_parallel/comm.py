"""The communication of tensor parallelism: four autograd functions, written out in pairs.

Tensor parallelism (TP) splits one layer's weight matrix across the ranks of a group. Inside
the split ("the TP region") each rank holds a different slice of the activations; outside it
every rank holds the same full tensor. Crossing the border needs a collective in ONE direction
of autograd and nothing (or its conjugate) in the other:

* ``copy_to_tp``     forward: identity          backward: all-reduce (sum)
  Entering a column-parallel layer: every rank already has the full input, so the forward
  copies nothing. But each rank's slice of the weight sends back only ITS part of dL/dx;
  the true gradient is the sum over the ranks.
* ``reduce_from_tp`` forward: all-reduce (sum)  backward: identity
  Leaving a row-parallel layer: each rank computed a partial sum x_r @ W_r^T; the output is
  their sum. The gradient of a sum w.r.t. each summand is the same full tensor, which every
  rank already has: nothing to send.

They are conjugates: the forward of one is the backward of the other. A Megatron MLP (column
then row) uses each once: one all-reduce forward, one backward.

Sequence parallelism (SP) keeps the tensors OUTSIDE the TP region sharded along the sequence
(LayerNorm, dropout and the residual each see t/n tokens) and replaces each all-reduce by an
all-gather on the way in and a reduce-scatter on the way out (same bytes on the wire: an
all-reduce IS a reduce-scatter followed by an all-gather):

* into a column layer:      forward: all-gather along t    backward: reduce-scatter along t
  (written together with the linear in ``layers._SPColumnLinears``, so that it can keep the
  t/n-token shard for backward and all-gather it once more there, not the gathered input)
* ``reduce_scatter_to_sp``   forward: reduce-scatter along t backward: all-gather along t
and, where the sequence enters and leaves the SP part of the model (the embeddings and the
replicated head), the cheaper pair:
* ``scatter_to_sp``  forward: keep my slice of t     backward: all-gather along t
* ``gather_to_full`` forward: all-gather along t     backward: keep my slice of t

Every collective goes through ``_collective``, which records (operation, forward|backward,
bytes, tag) in the active ``Ledger`` (``with counting() as ledger``), so a real training step
can be compared with the design's count.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

SEQ_DIM = 1  # activations are (batch, sequence, features)


# --------------------------------------------------------------------------- the ledger
@dataclass
class Ledger:
    """Every collective issued while it is active: dicts with op, phase, bytes, wire, tag."""
    calls: list = field(default_factory=list)

    def count(self, op: str | None = None, phase: str | None = None) -> int:
        return sum(1 for c in self.calls if (op is None or c["op"] == op)
                   and (phase is None or c["phase"] == phase))

    def bytes(self, op: str | None = None, phase: str | None = None) -> int:
        return sum(c["bytes"] for c in self.calls if (op is None or c["op"] == op)
                   and (phase is None or c["phase"] == phase))

    def table(self) -> dict:
        """{(op, phase): (count, bytes)}"""
        out = {}
        for c in self.calls:
            n, b = out.get((c["op"], c["phase"]), (0, 0))
            out[(c["op"], c["phase"])] = (n + 1, b + c["bytes"])
        return out


_LEDGER: Ledger | None = None


@contextlib.contextmanager
def counting():
    """``with counting() as ledger:`` records every TP collective of this process."""
    global _LEDGER
    previous, _LEDGER = _LEDGER, Ledger()
    try:
        yield _LEDGER
    finally:
        _LEDGER = previous


WIRE = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
        "reduce_scatter": lambda n: (n - 1) / n}  # bytes each rank sends (ring) / full tensor


def _record(op: str, phase: str, tensor: torch.Tensor, tag: str) -> None:
    """bytes: the full tensor (all-reduced, or gathered / scattered); wire: what each rank sends
    with a ring algorithm, 2(n-1)/n of it for an all-reduce, (n-1)/n for its two halves."""
    if _LEDGER is not None:
        size = tensor.numel() * tensor.element_size()
        _LEDGER.calls.append({"op": op, "phase": phase, "tag": tag, "bytes": size,
                              "wire": size * WIRE[op](dist.get_world_size())})


# --------------------------------------------------------------------------- raw collectives
def all_reduce(x: torch.Tensor, phase: str, tag: str = "", group=None,
               op=dist.ReduceOp.SUM) -> torch.Tensor:
    """Sum (or ``op``) over the TP ranks, out of place; bytes recorded = the tensor of one rank."""
    x = x.contiguous().clone()
    _record("all_reduce", phase, x, tag)
    dist.all_reduce(x, op=op, group=group)
    return x


def all_gather_seq(x: torch.Tensor, phase: str, tag: str = "", group=None) -> torch.Tensor:
    """(b, t/n, d) on each rank -> (b, t, d) on every rank; bytes recorded = the full result."""
    n = dist.get_world_size(group)
    parts = [torch.empty_like(x) for _ in range(n)]
    dist.all_gather(parts, x.contiguous(), group=group)
    out = torch.cat(parts, dim=SEQ_DIM)
    _record("all_gather", phase, out, tag)
    return out


def reduce_scatter_seq(x: torch.Tensor, phase: str, tag: str = "", group=None) -> torch.Tensor:
    """(b, t, d) partial sums on each rank -> my (b, t/n, d) slice of their sum.

    CUDA tensors (NCCL) use reduce_scatter. CPU tensors (gloo) take an all-reduce, then my slice:
    the same numbers on every torch the workshop runs on (gloo's reduce_scatter arrived in torch
    2.8, and torch builds it from all-reduces too, pytorch/pytorch#149869). The ledger records
    what a ring reduce-scatter sends, as NCCL's does."""
    _record("reduce_scatter", phase, x, tag)
    n, r = dist.get_world_size(group), dist.get_rank(group)
    if x.is_cuda:
        out = torch.empty_like(x.chunk(n, dim=SEQ_DIM)[r]).contiguous()
        dist.reduce_scatter(out, [c.contiguous() for c in x.chunk(n, dim=SEQ_DIM)], group=group)
        return out
    full = x.contiguous().clone()
    dist.all_reduce(full, group=group)
    return full.chunk(n, dim=SEQ_DIM)[r].contiguous()


def my_slice_seq(x: torch.Tensor, group=None) -> torch.Tensor:
    n, r = dist.get_world_size(group), dist.get_rank(group)
    return x.chunk(n, dim=SEQ_DIM)[r].contiguous()


# --------------------------------------------------------------------------- tensor parallel
class _CopyToTP(torch.autograd.Function):
    """f: identity forward, all-reduce backward (in front of a column-parallel layer)."""

    @staticmethod
    def forward(ctx, x, tag):
        ctx.tag = tag
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return all_reduce(grad, "backward", ctx.tag), None


class _ReduceFromTP(torch.autograd.Function):
    """g: all-reduce forward, identity backward (behind a row-parallel layer)."""

    @staticmethod
    def forward(ctx, x, tag):
        return all_reduce(x, "forward", tag)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def copy_to_tp(x, tag: str = ""):
    return _CopyToTP.apply(x, tag)


def reduce_from_tp(x, tag: str = ""):
    return _ReduceFromTP.apply(x, tag)


# --------------------------------------------------------------------------- sequence parallel
class _GatherToFull(torch.autograd.Function):
    """all-gather along t forward (for a replicated consumer, the head); backward: just my
    slice, since every rank holds the same full gradient."""

    @staticmethod
    def forward(ctx, x, tag):
        return all_gather_seq(x, "forward", tag)

    @staticmethod
    def backward(ctx, grad):
        return my_slice_seq(grad), None


class _ReduceScatterToSP(torch.autograd.Function):
    """reduce-scatter along t forward (behind a row-parallel layer), all-gather backward."""

    @staticmethod
    def forward(ctx, x, tag):
        ctx.tag = tag
        return reduce_scatter_seq(x, "forward", tag)

    @staticmethod
    def backward(ctx, grad):
        return all_gather_seq(grad, "backward", ctx.tag), None


class _ScatterToSP(torch.autograd.Function):
    """keep my slice of t forward (no communication), all-gather backward."""

    @staticmethod
    def forward(ctx, x, tag):
        ctx.tag = tag
        return my_slice_seq(x)

    @staticmethod
    def backward(ctx, grad):
        return all_gather_seq(grad, "backward", ctx.tag), None


def gather_to_full(x, tag: str = ""):
    return _GatherToFull.apply(x, tag)


def reduce_scatter_to_sp(x, tag: str = ""):
    return _ReduceScatterToSP.apply(x, tag)


def scatter_to_sp(x, tag: str = ""):
    return _ScatterToSP.apply(x, tag)


def all_reduce_grads(params, tag: str = "sp-replicated-grad") -> None:
    """SP only: a replicated parameter (LayerNorm) saw t/n tokens per rank; sum its gradient.
    One all-reduce per parameter, as the DTensor version does it."""
    for p in params:
        if p.grad is not None:
            p.grad.copy_(all_reduce(p.grad, "backward", tag))
