"""Why context parallelism: the activations one long sequence leaves for backward, per rank.

Counted with ``source_code.memory.saved`` (saved-tensor hooks, distinct storages, parameters
excluded), the method of notebook 08. Run on every rank (processes.spawn); for each sequence
length t it returns the bytes of one TransformerLM block forward:

* ``full_naive``: one process, the whole sequence, attention with materialised (t x t) scores;
* ``full_sdpa``: one process, the whole sequence, PyTorch's fused attention (keeps q, k, v,
  out and one log-sum-exp per query, never the scores);
* ``cp``: this rank's t/n tokens with ring attention (keeps the same for its own tokens).

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


def memory_report(lengths=LENGTHS, dim: int = 64, heads: int = 4, batch: int = 1,
                  layout: str = "zigzag") -> dict:
    device = context().device
    r, n = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    block = models.Block(dim, heads).to(device)
    params = list(block.parameters())
    ring = Ring()
    cp_core = functools.partial(ring_attention, causal=True, layout=layout, ring=ring)
    rows = []
    for t in lengths:
        x = torch.randn(batch, t, dim, device=device, requires_grad=True)
        x_local = lay.shard(x.detach(), r, n, layout, dim=1).requires_grad_(True)
        qkv = [torch.randn(batch, heads, t, dim // heads, device=device, requires_grad=True) for _ in range(3)]
        local = [lay.shard(a.detach(), r, n, layout).requires_grad_(True) for a in qkv]
        rows.append({
            "seq": t,
            "full_naive": _bytes(lambda: cpmodel.block_forward(block, x, cpmodel.naive), params),
            "full_sdpa": _bytes(lambda: cpmodel.block_forward(block, x, cpmodel.sdpa), params),
            "cp": _bytes(lambda: cpmodel.block_forward(block, x_local, cp_core), params),
            "full_naive_core": _bytes(lambda: cpmodel.naive(*qkv), ()),
            "full_sdpa_core": _bytes(lambda: cpmodel.sdpa(*qkv), ()),
            "cp_core": _bytes(lambda: cp_core(*local), ()),
        })
    return {"rank": r, "world": n, "dim": dim, "heads": heads, "batch": batch, "rows": rows}
