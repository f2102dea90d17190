"""Which tokens each rank holds: contiguous slices or the zigzag (head-tail) layout, and the
attention work that follows from it.

The sequence of T tokens is cut into equal chunks:

* ``contiguous``: n chunks of T/n tokens; rank r holds chunk r.
* ``zigzag``: 2n chunks of T/(2n) tokens; rank r holds chunk r and chunk 2n-1-r (one from
  the head, one from the tail), so that under a causal mask every rank scores as many
  query-key pairs as every other.

A sequence length that does not divide is refused with a clear error (``check_length``), not
padded: padding would need a key mask on top of the causal one in every attention call, and
the lesson is the ring. Pad the batch to the next multiple before sharding (the message names
it). The work of a rank is counted exactly from the chunks it scores (``work_per_rank``); a
wrapper around the block attention kernel counts, on the other side, the entries its mask left
visible in the scores it computed (probes.py), and the notebook compares the two.
"""
from __future__ import annotations

import torch

LAYOUTS = ("contiguous", "zigzag")


def chunks_per_rank(layout: str) -> int:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    return 1 if layout == "contiguous" else 2


def check_length(seq_len: int, world: int, layout: str) -> int:
    """The chunk size, or a ValueError that says which lengths work and how to pad."""
    parts = world * chunks_per_rank(layout)
    if seq_len <= 0:
        raise ValueError(f"sequence length {seq_len}: give a positive length, a multiple of {parts} "
                         f"({chunks_per_rank(layout)} x world size {world}, {layout} layout)")
    if seq_len % parts:
        nxt = -(-seq_len // parts) * parts
        raise ValueError(f"sequence length {seq_len} is not a multiple of {parts} "
                         f"({chunks_per_rank(layout)} x world size {world}, {layout} layout): "
                         f"pad the batch to {nxt} tokens before sharding")
    return seq_len // parts


def chunk_ids(rank: int, world: int, layout: str) -> list[int]:
    """The chunks rank ``rank`` holds, in the order they sit in its local tensor."""
    if layout == "contiguous":
        return [rank]
    chunks_per_rank(layout)
    return [rank, 2 * world - 1 - rank]


def token_index(seq_len: int, rank: int, world: int, layout: str) -> torch.Tensor:
    """Global positions of the tokens rank ``rank`` holds (its local order)."""
    size = check_length(seq_len, world, layout)
    return torch.cat([torch.arange(c * size, (c + 1) * size) for c in chunk_ids(rank, world, layout)])


def shard(x: torch.Tensor, rank: int, world: int, layout: str, dim: int = 2) -> torch.Tensor:
    """This rank's tokens of ``x`` along ``dim`` (a copy)."""
    idx = token_index(x.shape[dim], rank, world, layout).to(x.device)
    return x.index_select(dim, idx)


def unshard(parts: list[torch.Tensor], layout: str, dim: int = 2) -> torch.Tensor:
    """The full sequence from every rank's local tensor (``parts[r]`` is rank r's)."""
    world = len(parts)
    seq_len = sum(p.shape[dim] for p in parts)
    order = torch.cat([token_index(seq_len, r, world, layout) for r in range(world)])
    full = torch.cat(parts, dim=dim)
    return full.index_select(dim, torch.argsort(order).to(full.device))


def pairs(size: int, q_chunk: int, k_chunk: int, causal: bool) -> int:
    """Query-key pairs a query chunk scores against a key chunk: all of them, none (a key
    chunk after the query chunk under the causal mask), or the lower triangle (the same chunk)."""
    if not causal or k_chunk < q_chunk:
        return size * size
    if k_chunk > q_chunk:
        return 0
    return size * (size + 1) // 2


def work_per_rank(seq_len: int, world: int, layout: str, causal: bool) -> list[int]:
    """Query-key pairs each rank scores in one attention forward, counted chunk by chunk."""
    size = check_length(seq_len, world, layout)
    every = [c for r in range(world) for c in chunk_ids(r, world, layout)]
    return [sum(pairs(size, q, k, causal) for q in chunk_ids(r, world, layout) for k in every)
            for r in range(world)]


def entries_per_rank(seq_len: int, world: int, layout: str, causal: bool) -> list[int]:
    """Score entries each rank COMPUTES in one forward with ring.py's block kernel: a diagonal
    block is computed whole and half of it masked (size x size), a skipped block costs nothing.
    This, not the visible pairs, is what its compute time follows."""
    size = check_length(seq_len, world, layout)
    every = [c for r in range(world) for c in chunk_ids(r, world, layout)]
    return [sum(size * size for q in chunk_ids(r, world, layout) for k in every
                if pairs(size, q, k, causal)) for r in range(world)]


def imbalance(work: list[int]) -> float:
    """max / min over the ranks: 1.0 is perfect balance; the step waits for the max."""
    return max(work) / min(work)
