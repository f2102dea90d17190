"""Run on every rank (processes.spawn): ring attention against full attention on one process.

``parity`` builds the same q, k, v and upstream gradient on every rank from one seed,
computes full attention (F.scaled_dot_product_attention on the whole sequence, fp32) and its
gradients, then ring attention for each layout x causal on this rank's tokens, and compares
this rank's outputs and gradients with its slice of the reference. Also returned: the pairs
this rank scored, the bytes it sent per phase, and the error a bad sequence length gives.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from source_code.context_parallel import layout as lay
from source_code.context_parallel.comm import Ring
from source_code.context_parallel.ring import ring_attention
from source_code.distributed import context


@dataclass(frozen=True)
class Shape:
    batch: int = 2
    heads: int = 2
    seq: int = 48        # a multiple of 2 x 4: zigzag on 2 and 4 ranks
    head_dim: int = 8

    def kv_bytes(self, world: int, itemsize: int = 4) -> int:
        """Bytes of one rank's K (or V): b x h x t/n x d x itemsize."""
        return self.batch * self.heads * self.seq // world * self.head_dim * itemsize


def inputs(shape: Shape, device, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q, k, v, dout = (torch.randn(shape.batch, shape.heads, shape.seq, shape.head_dim, generator=g)
                     .to(device) for _ in range(4))
    return q, k, v, dout


def full_attention(q, k, v, dout, causal: bool) -> dict:
    """Reference on one process: output and gradients of q, k, v."""
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    out.backward(dout)
    return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item()


def one_case(q, k, v, dout, ref: dict, layout: str, causal: bool, overlap: bool = True) -> dict:
    """Ring attention on this rank's tokens vs its slice of ``ref``."""
    r, n = dist.get_rank(), dist.get_world_size()
    local = [lay.shard(t, r, n, layout).requires_grad_(True) for t in (q, k, v)]
    ring = Ring()
    out = ring_attention(*local, causal=causal, layout=layout, ring=ring, overlap=overlap)
    out.backward(lay.shard(dout, r, n, layout))
    diffs = {"out": max_diff(out.detach(), lay.shard(ref["out"], r, n, layout))}
    for name, t in zip(("dq", "dk", "dv"), local):
        diffs[name] = max_diff(t.grad, lay.shard(ref[name], r, n, layout))
    return {"layout": layout, "causal": causal, "diffs": diffs, "max_diff": max(diffs.values()),
            "pairs": {ph: ring.pairs(ph) for ph in ("forward", "backward")},
            "bytes": {ph: ring.bytes_sent(ph) for ph in ("forward", "backward")},
            "exchanges": {(e["phase"], e["what"]): sum(1 for x in ring.events if (x["phase"], x["what"])
                                                        == (e["phase"], e["what"])) for e in ring.events}}


def length_error(seq: int) -> str:
    """The message a sequence length that does not divide gets (zigzag on this world size)."""
    try:
        lay.check_length(seq, dist.get_world_size(), "zigzag")
    except ValueError as exc:
        return str(exc)
    return ""


def parity(shape: Shape = Shape(), seed: int = 0) -> dict:
    """Every layout x causal on this rank; see the module docstring."""
    device = context().device
    q, k, v, dout = inputs(shape, device, seed)
    cases = []
    for causal in (True, False):
        ref = full_attention(q, k, v, dout, causal)
        for layout in lay.LAYOUTS:
            cases.append(one_case(q, k, v, dout, ref, layout, causal))
    return {"rank": dist.get_rank(), "world": dist.get_world_size(), "device": device.type,
            "cases": cases, "length_error": length_error(shape.seq + 2)}
