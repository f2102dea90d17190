"""Ring attention: each rank holds the queries, keys and values of its own tokens; the K/V
blocks travel around the ring while every rank attends its queries to the block it holds.

Forward, on rank r of n (step s holds the K/V of rank (r - s) mod n):

    for step in range(n):
        post: send my current K/V block to rank r+1, receive the next from rank r-1
        for each of my query chunks, each chunk of the K/V block:      # 1 or 2 chunks (layout)
            the causal mask decides: skip it, or attend (masked or not)
            (out, lse) = attend(...)            # partial.py
            merge it into the running (out, lse) of that query chunk   # merge.py
        wait for the next block

Backward passes K/V around the ring once more, and with it the gradients dK/dV of the block:
each rank adds its contribution to the block's dK/dV and sends the sum on; after n hops the
sum arrives at the block's owner. dQ stays local. Every block is computed, merged and summed
in the wider of fp32 and the inputs' dtype (``wide``): the running output and lse, dQ, and the
dK/dV sums that travel (a bf16 sum of n contributions would lose digits at every hop; an fp64
one rounded to fp32 would lose half of fp64's), as flash attention computes a bf16 block in
fp32 and torch's context_parallel accumulates in fp32. K and V travel in the inputs' dtype;
the results are cast back to it at the end. Both
directions overlap the transfer with the compute (``overlap=False`` waits for each transfer
before computing, to measure what the overlap hides).

``kernel`` is the block attention (a module or object with ``attend`` and
``attend_backward``, partial.py by default); the harness passes a wrapper that times and
counts it, and a ``Ring`` subclass that records the transfers (probes.py). Nothing here
measures.

Shapes: q, k, v, out (b, h, t/n, d) where t/n are this rank's tokens in layout order
(layout.shard); lse (b, h, t/n).
"""
from __future__ import annotations

import math

import torch

from source_code.context_parallel import partial
from source_code.context_parallel.comm import Ring
from source_code.context_parallel.layout import chunk_ids, chunks_per_rank
from source_code.context_parallel.merge import merge


def blocks(rank: int, src: int, world: int, layout: str, causal: bool):
    """(my query chunk i, source key chunk j, diagonal?) for the chunk pairs that are scored."""
    for i, cq in enumerate(chunk_ids(rank, world, layout)):
        for j, ck in enumerate(chunk_ids(src, world, layout)):
            if not (causal and ck > cq):
                yield i, j, causal and ck == cq


class RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal: bool, layout: str, ring: Ring, overlap: bool, kernel):
        r, n = ring.rank, ring.world
        nchunks = len(chunk_ids(r, n, layout))
        size, scale = q.shape[2] // nchunks, 1.0 / math.sqrt(q.shape[-1])
        wide = torch.promote_types(q.dtype, torch.float32)     # computed and merged in this dtype
        qs = q.to(wide).split(size, dim=2)
        acc = [(None, None)] * nchunks                         # running (out, lse) per query chunk
        kv = torch.stack([k, v])                               # (2, b, h, t/n, d): one message
        for step in range(n):
            src = (r - step) % n
            pending = ring.exchange(kv, "kv") if overlap and step < n - 1 else None
            ks, vs = kv[0].to(wide).split(size, dim=2), kv[1].to(wide).split(size, dim=2)
            for i, j, diagonal in blocks(r, src, n, layout, causal):
                out_ij, lse_ij = kernel.attend(qs[i], ks[j], vs[j], scale, diagonal)
                acc[i] = merge(*acc[i], out_ij, lse_ij)
            if step < n - 1:
                kv = (pending or ring.exchange(kv, "kv")).wait()
        out = torch.cat([o for o, _ in acc], dim=2).to(q.dtype)
        lse = torch.cat([lse_i for _, lse_i in acc], dim=2)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.layout, ctx.ring, ctx.overlap, ctx.kernel = causal, layout, ring, overlap, kernel
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        ring, causal, layout, overlap, kernel = ctx.ring, ctx.causal, ctx.layout, ctx.overlap, ctx.kernel
        r, n = ring.rank, ring.world
        nchunks = len(chunk_ids(r, n, layout))
        size, scale = q.shape[2] // nchunks, 1.0 / math.sqrt(q.shape[-1])
        wide = lse.dtype                                        # the forward's: fp32, or fp64 inputs'
        qs, outs, lses = q.to(wide).split(size, 2), out.to(wide).split(size, 2), lse.split(size, 2)
        douts = dout.to(wide).contiguous().split(size, 2)
        dq = torch.zeros_like(q, dtype=wide)
        dqs = dq.split(size, 2)                                 # views: adding into them fills dq
        kv, incoming = torch.stack([k, v]), None
        for step in range(n):
            src = (r - step) % n
            pending = ring.exchange(kv, "kv") if overlap and step < n - 1 else None
            ks, vs = kv[0].to(wide).split(size, 2), kv[1].to(wide).split(size, 2)
            part = torch.zeros_like(kv, dtype=wide)             # my share of dK/dV of src's block
            dks, dvs = part[0].split(size, 2), part[1].split(size, 2)
            for i, j, diagonal in blocks(r, src, n, layout, causal):
                dq_ij, dk_ij, dv_ij = kernel.attend_backward(qs[i], ks[j], vs[j], outs[i], lses[i],
                                                             douts[i], scale, diagonal)
                dqs[i].add_(dq_ij)
                dks[j].add_(dk_ij)
                dvs[j].add_(dv_ij)
            dkv = part if incoming is None else incoming.wait() + part   # the block's sum so far
            if n > 1:
                incoming = ring.exchange(dkv, "dkv")                     # on to the next rank
                if not overlap:
                    incoming.wait()
            if step < n - 1:
                kv = (pending or ring.exchange(kv, "kv")).wait()
        dkv = (incoming.wait() if n > 1 else dkv).to(k.dtype)   # after n hops: my own block's sum
        return dq.to(q.dtype), dkv[0], dkv[1], None, None, None, None, None


def ring_attention(q, k, v, causal: bool = True, layout: str = "zigzag", ring: Ring | None = None,
                   overlap: bool = True, kernel=partial) -> torch.Tensor:
    """Attention of this rank's queries over the whole sequence; q, k, v (b, h, t/n, d).

    Refuses what it cannot compute: local lengths that differ (every rank's block must have
    the same shape to travel), and under the zigzag layout an odd local length (a rank holds
    a head chunk and a tail chunk of equal length)."""
    if not (q.dim() == 4 and q.shape == k.shape == v.shape):
        raise ValueError(f"ring_attention: q, k, v must have one shape (b, h, t/n, d), got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}: shard all three with "
                         "layout.shard (grouped K/V heads: repeat them to q's heads first)")
    per = chunks_per_rank(layout)
    if q.shape[2] % per or q.shape[2] == 0:
        raise ValueError(f"ring_attention: this rank holds {q.shape[2]} tokens; the {layout} layout "
                         f"needs a positive multiple of {per} ({per} chunks of equal length): pad the "
                         f"sequence to a multiple of {per} x world size (layout.check_length) and "
                         "shard it with layout.shard")
    return RingAttention.apply(q, k, v, causal, layout, ring or Ring(), overlap, kernel)
