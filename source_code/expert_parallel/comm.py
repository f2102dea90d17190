"""The communication of expert parallelism: all-to-all, counts first, then the payload.

After routing, rank r holds rows (tokens) for every expert; expert e lives on rank e // (E/n).
Every rank must send each rank its rows and receive from each rank the rows for its own
experts: **all-to-all** (each rank sends a different piece to each rank). The pieces differ in
size and change every step (they depend on the router), so it takes two calls:

1. ``exchange_counts``: an all-to-all of the per-expert counts (E int64 numbers per rank, E/n
   to each rank, equal sizes): afterwards every rank knows how many rows it will receive from
   each rank for each of its experts, so it can allocate the buffer and later sort the rows.
2. ``all_to_all``: the payload, ``dist.all_to_all_single(out, x, recv_splits, send_splits)``,
   one contiguous buffer sorted by destination and a list of row counts per rank. Its
   backward is the same call with the splits swapped: gradients travel back to where the rows
   came from. The second all-to-all (results back to the tokens' ranks) is this function
   again with the splits swapped.

gloo: ``all_to_all_single`` with unequal splits works on gloo on torch 2.6, 2.11 and 2.14 (the
compare entry point runs on each; tests/test_expert_parallel_comm.py on the pinned one);
``dist.all_to_all`` with a list of tensors does not (2.6: "Backend gloo does
not support alltoall"; 2.14: equal tensor sizes only), so everything here uses the single-
buffer form, which is also the one production MoE code calls (torchtitan's expert parallelism
exchanges its per-expert counts and then its tokens with all_to_all_single).

What each call moves is counted outside this file, from the buffers and splits it is handed
(``wire.recording``, a wrapper around ``dist.all_to_all_single``): the lines here are the
algorithm only.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def exchange_counts(per_expert: torch.Tensor, group=None) -> torch.Tensor:
    """(E,) rows this rank sends to each expert -> (n * E/n,) rows it receives: entry
    s * (E/n) + j is what rank s sends to this rank's j-th expert."""
    received = torch.empty_like(per_expert)
    dist.all_to_all_single(received, per_expert, group=group)   # equal splits: E/n per rank
    return received


class AllToAll(torch.autograd.Function):
    """The payload all-to-all; its backward sends the gradients back along the same rows."""

    @staticmethod
    def forward(ctx, x, send_splits, recv_splits, group):
        ctx.send, ctx.recv, ctx.group = send_splits, recv_splits, group
        out = x.new_empty((sum(recv_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), recv_splits, send_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        out = grad.new_empty((sum(ctx.send), *grad.shape[1:]))
        dist.all_to_all_single(out, grad.contiguous(), ctx.send, ctx.recv, group=ctx.group)
        return out, None, None, None


def all_to_all(x: torch.Tensor, send_splits: list, recv_splits: list, group=None) -> torch.Tensor:
    """Rows x[sum(send[:j]) : sum(send[:j+1])] go to rank j; the result stacks what each rank
    sent here, rank 0's rows first: (sum(recv_splits), ...). Differentiable."""
    send_splits, recv_splits = list(send_splits), list(recv_splits)
    n = dist.get_world_size(group)
    if len(send_splits) != n or len(recv_splits) != n or min(send_splits + recv_splits) < 0:
        raise ValueError(f"all_to_all needs {n} split sizes >= 0 each way, got send {send_splits}, "
                         f"recv {recv_splits}")
    if sum(send_splits) != x.shape[0]:
        raise ValueError(f"the send splits {send_splits} add up to {sum(send_splits)} rows, but x has "
                         f"{x.shape[0]}: sort x by destination and count every row once")
    return AllToAll.apply(x, send_splits, recv_splits, group)
