"""Run on every rank (processes.spawn): the three context-parallel families side by side.

``report`` runs, on the same q, k, v and upstream gradient (every rank draws them from one
seed), the ring, all-gather and Ulysses attention (families.py) for both layouts, causal and
not, and compares each rank's output and gradients of q, k, v with its slice of full attention
on one process (harness.full_attention). Measured from outside the lesson code:

* bytes each rank sent per phase: the ring's from its recording ``Ring`` (probes.py), the
  other two's from ``CollectiveBytes``, measure.CommCounter taught the all-to-all (what a rank
  sends in one: the (n-1)/n of its input that goes to the others);
* activation bytes the attention core keeps for backward per rank, for growing sequence
  lengths (memory.saved, as memory.py counts the ring's); the all-gather's position mask is
  left out of the count (``mask_free``): a GPU kernel builds it from the positions, the CPU
  one is handed it as a (t/n x t) tensor;
* what Ulysses says when the heads do not split over the ranks.

``dtype_parity`` runs the same comparison in bf16, fp32 and fp64 against full attention in fp64
on the same (rounded) inputs, each dtype with its own tolerance (harness.tolerance).
"""
from __future__ import annotations

import math
from dataclasses import replace

import torch
import torch.distributed as dist

from source_code.context_parallel import families
from source_code.context_parallel import layout as lay
from source_code.context_parallel.harness import (Shape, full_attention, inputs, max_diff, measured_run, say,
                                                 tolerance)
from source_code.distributed import context
from source_code.measure import CommCounter
from source_code.memory.saved import SavedTensors

MEMORY_HEADS, MEMORY_HEAD_DIM = 4, 16     # memory.py's block: dim 64, 4 heads


class CollectiveBytes(CommCounter):
    """CommCounter that also counts ``all_to_all_single`` (c10d ``alltoall_base_``)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "c10d" and func.name().split("::")[-1].split(".")[0] == "alltoall_base_":
            full = args[1].numel() * args[1].element_size()               # (output, input, ...)
            self.calls["all_to_all"] += 1
            self.payload["all_to_all"] += full
            self.wire += (self.n - 1) / self.n * full
            self.ops.append(("all_to_all", full))
            return func(*args, **(kwargs or {}))
        return super().__torch_dispatch__(func, types, args, kwargs)


def _run(family, q, k, v, dout, layout, causal):
    """Forward + backward on this rank's tokens: (out, [dq, dk, dv], bytes sent per phase)."""
    r, n = dist.get_rank(), dist.get_world_size()
    if family == "ring":
        out, grads, probe = measured_run(q, k, v, dout, layout, causal)
        return out, grads, {ph: probe.bytes_sent(ph) for ph in ("forward", "backward")}
    local = [lay.shard(t, r, n, layout).requires_grad_(True) for t in (q, k, v)]
    sent = {}
    with CollectiveBytes(n) as c:
        out = families.attention(family, *local, causal=causal, layout=layout)
    sent["forward"] = c.wire
    with CollectiveBytes(n) as c:
        out.backward(lay.shard(dout, r, n, layout))
    sent["backward"] = c.wire
    return out.detach(), [t.grad for t in local], sent


def parity(shape: Shape = Shape(), verbose: bool = False) -> list[dict]:
    r, n = dist.get_rank(), dist.get_world_size()
    q, k, v, dout = inputs(shape, context().device)
    rows = []
    for causal in (True, False):
        ref = full_attention(q, k, v, dout, causal)
        for layout in lay.LAYOUTS:
            for family in families.FAMILIES:
                out, grads, sent = _run(family, q, k, v, dout, layout, causal)
                diffs = {"out": max_diff(out, lay.shard(ref["out"], r, n, layout))}
                for key, g in zip(("dq", "dk", "dv"), grads):
                    diffs[key] = max_diff(g, lay.shard(ref[key], r, n, layout))
                rows.append({"family": family, "layout": layout, "causal": causal, "diffs": diffs,
                             "max_diff": max(diffs.values()), "sent": sent})
        say(f"ring, all-gather, Ulysses, causal={causal}: largest |diff| from full attention "
            f"{max(x['max_diff'] for x in rows if x['causal'] == causal):.1e}", verbose)
    return rows


def dtype_parity(shape: Shape = Shape(), dtypes=(torch.bfloat16, torch.float32, torch.float64)) -> list[dict]:
    """Every family, layout and mask in each of ``dtypes``: {dtype, family, layout, causal,
    diffs, tols} with the largest |diff| of the output and each gradient from fp64 full
    attention on the same inputs, and the tolerance of each (this rank's tokens)."""
    r, n = dist.get_rank(), dist.get_world_size()
    rows = []
    for dtype in dtypes:
        q, k, v, dout = inputs(shape, context().device, dtype=dtype)
        for causal in (True, False):
            ref = full_attention(*(t.double() for t in (q, k, v, dout)), causal)
            for layout in lay.LAYOUTS:
                for family in families.FAMILIES:
                    out, grads, _ = _run(family, q, k, v, dout, layout, causal)
                    got = dict(zip(("out", "dq", "dk", "dv"), [out, *grads]))
                    mine = {key: lay.shard(ref[key], r, n, layout) for key in got}
                    rows.append({"dtype": str(dtype).split(".")[-1], "family": family, "layout": layout,
                                 "causal": causal, "dtypes": {key: str(g.dtype).split(".")[-1] for key, g in got.items()},
                                 "diffs": {key: max_diff(got[key], mine[key]) for key in got},
                                 "tols": {key: tolerance(dtype, ref[key]) for key in got}})
    return rows


def mask_free(saved: SavedTensors) -> int:
    """Saved bytes without 2-D tensors (the all-gather's (t/n x t) mask; every activation is 3-D or 4-D)."""
    return sum(b for (_, shape), b in saved.by_shape.items() if len(shape) != 2)


def memory(lengths, batch: int = 1) -> list[dict]:
    """Bytes the attention core keeps for backward on this rank, per family and length."""
    device, n = context().device, dist.get_world_size()
    rows = []
    for t in lengths:
        lay.check_length(t, n, "zigzag")
        local = [torch.randn(batch, MEMORY_HEADS, t // n, MEMORY_HEAD_DIM, device=device, requires_grad=True)
                 for _ in range(3)]
        row = {"seq": t}
        for family in families.FAMILIES:
            with SavedTensors() as saved:
                out = families.attention(family, *local, causal=True, layout="zigzag")
            del out
            row[family] = mask_free(saved)
        rows.append(row)
    return rows


def heads_refusal(shape: Shape) -> str:
    """What Ulysses says to ``shape``'s heads on this world (empty: they split)."""
    q, k, v, _ = inputs(shape, context().device)
    r, n = dist.get_rank(), dist.get_world_size()
    try:
        families.ulysses_attention(*(lay.shard(t, r, n, "zigzag") for t in (q, k, v)))
    except ValueError as exc:
        return str(exc)
    return ""


def family_shape(shape: Shape, world: int) -> Shape:
    """``shape`` with heads raised to a multiple of ``world``: what every family can run."""
    return replace(shape, heads=math.lcm(shape.heads, world))


def report(shape: Shape = Shape(), verbose: bool = False, lengths=()) -> dict:
    """Parity and bytes of the three families on ``family_shape``; the activation bytes for
    ``lengths`` (none: skipped); what Ulysses says to ``shape``'s own heads."""
    fam = family_shape(shape, dist.get_world_size())
    rows = parity(fam, verbose=verbose)
    mem = memory(lengths) if lengths else None
    if lengths:
        say(f"activation bytes of the three families counted for t = {', '.join(map(str, lengths))}", verbose)
    return {"rank": dist.get_rank(), "world": dist.get_world_size(), "shape": fam, "rows": rows,
            "memory": mem, "heads_refusal": heads_refusal(shape)}
