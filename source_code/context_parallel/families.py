"""Two other ways to split attention over the sequence, beside the ring (ring.py).

**All-gather** (Llama 3's choice; torch's ``context_parallel`` calls it the all-gather
rotate method): every rank gathers the K and V of ALL tokens, then attends its own queries to
them in one call. The mask follows the positions: a rank's queries are its tokens (layout.py,
contiguous or zigzag), the gathered keys are every rank's tokens in rank order, and a query
sees a key when the key's position is not later than its own. Backward: dK/dV of the whole
sequence come out of the call; a reduce-scatter sums each block's gradients at its owner.

    k_all, v_all = gather_seq(stack([k, v]))          # (n, 2, b, h, t/n, d): every rank's K/V
    out = sdpa(q, k_all, v_all, mask=key_pos <= query_pos)

**Ulysses** (DeepSpeed-Ulysses): an all-to-all turns the sequence-sharded q, k, v into
head-sharded ones: each rank then holds ALL tokens of h/n heads, and attention over a head
needs no other head, so full attention runs as on one process; a second all-to-all turns the
output back into this rank's tokens of all heads. The heads must split evenly over the ranks
(``check_heads`` refuses the rest: pad the heads, or run fewer CP ranks).

    q, k, v = seq_to_heads(stack([q, k, v]))         # (3, b, h/n, t, d): all tokens, my heads
    out = heads_to_seq(sdpa(q, k, v, causal, in sequence order))    # (b, h, t/n, d)

Shapes: q, k, v, out (b, h, t/n, d), this rank's tokens in layout order (layout.shard).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from source_code.context_parallel import layout as lay
from source_code.context_parallel.collectives import gather_seq, heads_to_seq, seq_to_heads
from source_code.context_parallel.comm import Ring
from source_code.context_parallel.ring import ring_attention

FAMILIES = ("ring", "allgather", "ulysses")


def _positions(local_len: int, world: int, layout: str) -> torch.Tensor:
    """Global positions of every rank's tokens, rank after rank: (n, t/n)."""
    seq = local_len * world
    return torch.stack([lay.token_index(seq, r, world, layout) for r in range(world)])


def allgather_attention(q, k, v, causal: bool = True, layout: str = "zigzag", group=None):
    """This rank's queries against the K/V of every rank, gathered."""
    n, r = dist.get_world_size(group), dist.get_rank(group)
    b, h, s, d = q.shape
    kv = gather_seq(torch.stack([k, v]), group)                     # (n, 2, b, h, t/n, d)
    kv = kv.movedim(0, 3).reshape(2, b, h, n * s, d)                # keys in rank order
    mask = None
    if causal:
        pos = _positions(s, n, layout).to(q.device)                 # (n, t/n)
        mask = pos.reshape(1, -1) <= pos[r].reshape(-1, 1)          # (t/n, t): key not later
    return F.scaled_dot_product_attention(q, kv[0], kv[1], attn_mask=mask)


def check_heads(heads: int, world: int) -> None:
    """Ulysses gives each rank heads / world heads; a ValueError that names the fix."""
    if heads % world:
        raise ValueError(f"Ulysses splits the heads over the ranks: {heads} heads do not divide over "
                         f"{world} ranks; use a number of ranks that divides {heads}, or a model with "
                         f"a multiple of {world} heads (or the ring / all-gather, which split no heads)")


def ulysses_attention(q, k, v, causal: bool = True, layout: str = "zigzag", group=None):
    """Full attention over all tokens on heads / n heads per rank, between two all-to-alls."""
    n = dist.get_world_size(group)
    check_heads(q.shape[1], n)
    qkv = seq_to_heads(torch.stack([q, k, v]), group)               # (3, b, h/n, t, d), rank order
    order = _positions(q.shape[2], n, layout).reshape(-1).to(q.device)   # position of each row
    to_seq, back = torch.argsort(order), None
    if layout != "contiguous":                                      # rank order != sequence order
        back = torch.argsort(to_seq)
        qkv = qkv.index_select(3, to_seq)
    out = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=causal)
    if back is not None:
        out = out.index_select(2, back)                             # rows back in rank order
    return heads_to_seq(out, group)                                 # (b, h, t/n, d)


def attention(family: str, q, k, v, causal: bool = True, layout: str = "zigzag", group=None):
    """Any of the three families on this rank's tokens (the ring from ring.py)."""
    if family == "ring":
        return ring_attention(q, k, v, causal=causal, layout=layout, ring=Ring(group))
    if family == "allgather":
        return allgather_attention(q, k, v, causal, layout, group)
    if family == "ulysses":
        return ulysses_attention(q, k, v, causal, layout, group)
    raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
