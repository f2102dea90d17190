"""The collectives of the two other context-parallel families, with their backward passes.

* ``gather_seq(x)``: all-gather of this rank's tokens from every rank, (...) -> (n, ...);
  backward: reduce-scatter (each rank gets the sum of every rank's gradient of ITS tokens).
  All-gather CP gathers K and V with it.
* ``seq_to_heads(x)``: all-to-all from sequence-sharded (..., h, t/n, d) to head-sharded
  (..., h/n, t, d): rank r sends head group j of its tokens to rank j and receives head
  group r of every rank's tokens; ``heads_to_seq`` is the inverse, and each one's backward
  is the other. Ulysses wraps full attention in the two.

On gloo and NCCL alike these are ``all_gather_into_tensor`` / ``reduce_scatter_tensor``
(their torch 2.14 names ``all_gather_single`` / ``reduce_scatter_single`` where they exist)
and ``all_to_all_single`` with equal splits. Nothing here measures: the harness counts the
bytes with a dispatch mode around the calls (family_check.py).

Shapes: the sequence is dim -2, the heads dim -3; leading dims (a stack of q, k, v, the
batch) travel along.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

# torch 2.14 renames the two tensor collectives (a FutureWarning); older versions have only the old names
ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class GatherSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        n = dist.get_world_size(group)
        out = x.new_empty((n * x.shape[0], *x.shape[1:]))   # concatenated along dim 0
        ALL_GATHER(out, x.contiguous(), group=group)
        return out.view(n, *x.shape)                        # (n, ...): rank j's tokens at [j]

    @staticmethod
    def backward(ctx, grad):
        mine = grad.new_empty(grad.shape[1:])
        REDUCE_SCATTER(mine, grad.reshape(-1, *grad.shape[2:]).contiguous(), group=ctx.group)   # sum over ranks of my slice
        return mine, None


def _seq_to_heads(x, group):
    n = dist.get_world_size(group)
    *lead, h, s, d = x.shape
    send = x.reshape(*lead, n, h // n, s, d).movedim(-4, 0).contiguous()   # (n, ..., h/n, s, d)
    recv = torch.empty_like(send)                                            # [j]: rank j's tokens
    dist.all_to_all_single(recv, send, group=group)
    return recv.movedim(0, -3).reshape(*lead, h // n, n * s, d)              # (..., h/n, n s, d)


def _heads_to_seq(x, group):
    n = dist.get_world_size(group)
    *lead, hn, t, d = x.shape
    send = x.reshape(*lead, hn, n, t // n, d).movedim(-3, 0).contiguous()   # (n, ..., h/n, t/n, d)
    recv = torch.empty_like(send)                                            # [j]: head group j
    dist.all_to_all_single(recv, send, group=group)
    return recv.movedim(0, -4).reshape(*lead, n * hn, t // n, d)             # (..., h, t/n, d)


class SeqToHeads(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _seq_to_heads(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _heads_to_seq(grad, ctx.group), None


class HeadsToSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _heads_to_seq(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _seq_to_heads(grad, ctx.group), None


def gather_seq(x, group=None):
    return GatherSeq.apply(x, group)


def seq_to_heads(x, group=None):
    return SeqToHeads.apply(x, group)


def heads_to_seq(x, group=None):
    return HeadsToSeq.apply(x, group)
