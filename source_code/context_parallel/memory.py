"""Why context parallelism: the activations one long sequence leaves for backward, per rank.

Counted with ``source_code.memory.saved`` (saved-tensor hooks, distinct storages, parameters
excluded), the method of notebook 08. For each sequence length t, the bytes
of one TransformerLM block forward:

* ``full_naive`` (``full_report``, one process): the whole sequence, attention with the
  (t x t) scores materialised;
* ``full_sdpa`` (the same): PyTorch's fused attention, which keeps q, k, v, out and one
  log-sum-exp per query, never the scores;
* ``cp`` (``cp_report``, on every rank of a group): this rank's t/n tokens with ring
  attention, which keeps the same for its own tokens. Bytes do not depend on the values,
  so each rank draws random inputs of its local shape.

and the same for the attention core alone (``*_core``).
"""
from __future__ import annotations

import functools

import torch
import torch.distributed as dist

from source_code import models
from source_code.context_parallel import layout as lay
from source_code.context_parallel import model as cpmodel
from source_code.context_parallel.comm import Ring
from source_code.context_parallel.ring import ring_attention
from source_code.distributed import context
from source_code.memory.saved import SavedTensors

LENGTHS = (256, 512, 1024, 2048)


def _bytes(fn, exclude) -> int:
    with SavedTensors(exclude=exclude) as saved:
        out = fn()
    del out
    return saved.bytes


def check_width(dim: int, heads: int) -> None:
    """A block's width must split evenly into its heads; a ValueError that names the fix."""
    if heads <= 0 or dim <= 0 or dim % heads:
        nearest = max(heads, 1) * max(1, round(dim / max(heads, 1)))
        raise ValueError(f"model width {dim} does not split into {heads} heads: choose a positive width "
                         f"that is a multiple of the heads (e.g. {nearest}), or heads that divide it")


def _block(dim: int, heads: int, device):
    check_width(dim, heads)
    torch.manual_seed(0)
    block = models.Block(dim, heads).to(device)
    return block, list(block.parameters())


def full_report(lengths=LENGTHS, dim: int = 64, heads: int = 4, batch: int = 1) -> list[dict]:
    """One process, the whole sequence (no process group needed): naive and fused attention."""
    block, params = _block(dim, heads, "cpu")
    rows = []
    for t in lengths:
        x = torch.randn(batch, t, dim, requires_grad=True)
        qkv = [torch.randn(batch, heads, t, dim // heads, requires_grad=True) for _ in range(3)]
        rows.append({"seq": t,
                     "full_naive": _bytes(lambda: cpmodel.block_forward(block, x, cpmodel.naive), params),
                     "full_sdpa": _bytes(lambda: cpmodel.block_forward(block, x, cpmodel.sdpa), params),
                     "full_naive_core": _bytes(lambda: cpmodel.naive(*qkv), ()),
                     "full_sdpa_core": _bytes(lambda: cpmodel.sdpa(*qkv), ())})
    return rows


def cp_report(lengths=LENGTHS, dim: int = 64, heads: int = 4, batch: int = 1,
              layout: str = "zigzag") -> dict:
    """Run on every rank: this rank's t/n tokens through the block with ring attention."""
    device = context().device
    r, n = dist.get_rank(), dist.get_world_size()
    block, params = _block(dim, heads, device)
    core = functools.partial(ring_attention, causal=True, layout=layout, ring=Ring())
    rows = []
    for t in lengths:
        lay.check_length(t, n, layout)
        x_local = torch.randn(batch, t // n, dim, device=device, requires_grad=True)
        local = [torch.randn(batch, heads, t // n, dim // heads, device=device, requires_grad=True)
                 for _ in range(3)]
        rows.append({"seq": t, "cp": _bytes(lambda: cpmodel.block_forward(block, x_local, core), params),
                     "cp_core": _bytes(lambda: core(*local), ())})
    return {"rank": r, "world": n, "rows": rows}
