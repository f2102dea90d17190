"""Run on every rank (processes.spawn): ring attention against full attention on one process.

``parity`` builds the same q, k, v and upstream gradient on every rank from one seed,
computes full attention (F.scaled_dot_product_attention on the whole sequence, fp32) and its
gradients, then ring attention for each layout x causal on this rank's tokens, and compares
this rank's outputs and gradients with its slice of the reference. Also returned, measured
from outside the lesson code (probes.py): the score entries this rank's block attention
computed and those its mask left visible, the bytes it sent per phase, the same bytes for
bf16 inputs (whose dK/dV still travel in fp32), and the error a bad sequence length gives.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from source_code.context_parallel import layout as lay
from source_code.context_parallel.probes import Probe
from source_code.context_parallel.ring import ring_attention
from source_code.distributed import context
from source_code.measure import clock


@dataclass(frozen=True)
class Shape:
    batch: int = 2
    heads: int = 2
    seq: int = 48        # a multiple of 2 x 4: zigzag on 2 and 4 ranks
    head_dim: int = 8

    def kv_bytes(self, world: int, itemsize: int = 4) -> int:
        """Bytes of one rank's K (or V): b x h x t/n x d x itemsize."""
        return self.batch * self.heads * self.seq // world * self.head_dim * itemsize


def inputs(shape: Shape, device, seed: int = 0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q, k, v, dout = (torch.randn(shape.batch, shape.heads, shape.seq, shape.head_dim, generator=g)
                     .to(device, dtype) for _ in range(4))
    return q, k, v, dout


def full_attention(q, k, v, dout, causal: bool) -> dict:
    """Reference on one process: output and gradients of q, k, v."""
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    out.backward(dout)
    return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item()


# |diff| from full attention in fp64 on the same inputs, in units of the dtype's eps x the largest
# |value| of the compared tensor. bf16: computed in fp32 and rounded once at the end (ring.py; SDPA
# and the collectives likewise), so about eps / 2; fp32 and fp64: rounding accumulates over the
# sums of a score row and of the blocks (one-process SDPA itself reaches about 7 eps in fp32)
TOLERANCE_EPS = {torch.bfloat16: 2, torch.float32: 32, torch.float64: 32}


def tolerance(dtype: torch.dtype, reference: torch.Tensor) -> float:
    """The largest |diff| allowed from ``reference`` (fp64) for results computed in ``dtype``."""
    return TOLERANCE_EPS[dtype] * torch.finfo(dtype).eps * reference.abs().max().item()


def measured_run(q, k, v, dout, layout: str, causal: bool, overlap: bool = True, count: bool = False):
    """Ring attention forward + backward on this rank's tokens with a Probe around it:
    (output, grads of q, k, v, the probe)."""
    r, n = dist.get_rank(), dist.get_world_size()
    local = [lay.shard(t, r, n, layout).requires_grad_(True) for t in (q, k, v)]
    probe = Probe(q.device, count=count)
    out = ring_attention(*local, causal=causal, layout=layout, ring=probe.ring, overlap=overlap,
                         kernel=probe.kernel)
    probe.phase = "backward"
    out.backward(lay.shard(dout, r, n, layout))
    return out.detach(), [t.grad for t in local], probe


def one_case(q, k, v, dout, ref: dict, layout: str, causal: bool) -> dict:
    """Ring attention on this rank's tokens vs its slice of ``ref``, and what it did."""
    r, n = dist.get_rank(), dist.get_world_size()
    out, grads, probe = measured_run(q, k, v, dout, layout, causal, count=True)
    diffs = {"out": max_diff(out, lay.shard(ref["out"], r, n, layout))}
    for name, g in zip(("dq", "dk", "dv"), grads):
        diffs[name] = max_diff(g, lay.shard(ref[name], r, n, layout))
    hops = {}
    for e in probe.exchanges:
        hops[(e["phase"], e["what"])] = hops.get((e["phase"], e["what"]), 0) + 1
    return {"layout": layout, "causal": causal, "diffs": diffs, "max_diff": max(diffs.values()),
            "unmasked": {ph: probe.entries(ph, "unmasked") for ph in ("forward", "backward")},
            "computed": {ph: probe.entries(ph, "computed") for ph in ("forward", "backward")},
            "bytes": {ph: probe.bytes_sent(ph) for ph in ("forward", "backward")},
            "exchanges": hops}


def bf16_bytes(shape: Shape) -> dict:
    """Bytes sent per phase and message kind by a zigzag causal ring on bf16 inputs."""
    q, k, v, dout = inputs(shape, context().device, dtype=torch.bfloat16)
    *_, probe = measured_run(q, k, v, dout, "zigzag", True)
    return {(ph, what): probe.bytes_sent(ph, what) for ph, what in
            (("forward", "kv"), ("backward", "kv"), ("backward", "dkv"))}


def length_error(seq: int) -> str:
    """The message a sequence length that does not divide gets (zigzag on this world size)."""
    try:
        lay.check_length(seq, dist.get_world_size(), "zigzag")
    except ValueError as exc:
        return str(exc)
    return ""


def say(text: str, verbose: bool) -> None:
    """A progress line from rank 0 (streamed into the notebook by processes.spawn)."""
    if verbose and dist.get_rank() == 0:
        print(f"rank 0 of {dist.get_world_size()}: {text}", flush=True)


def parity(shape: Shape = Shape(), seed: int = 0, verbose: bool = False) -> dict:
    """Every layout x causal on this rank; see the module docstring."""
    device = context().device
    q, k, v, dout = inputs(shape, device, seed)
    cases = []
    for causal in (True, False):
        ref = full_attention(q, k, v, dout, causal)
        for layout in lay.LAYOUTS:
            t0 = clock(device)
            cases.append(one_case(q, k, v, dout, ref, layout, causal))
            say(f"ring attention, {layout}, causal={causal}: max |diff| from full attention "
                f"{cases[-1]['max_diff']:.1e} ({clock(device) - t0:.2f} s)", verbose)
    return {"rank": dist.get_rank(), "world": dist.get_world_size(), "device": device.type,
            "cases": cases, "bf16_bytes": bf16_bytes(shape), "length_error": length_error(shape.seq + 2)}
