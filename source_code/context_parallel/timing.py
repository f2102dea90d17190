"""Run on every rank (processes.spawn): what the layouts and the overlap cost in time.

* ``step_times``: forward + backward of causal ring attention, contiguous and zigzag
  alternating step by step (each between barriers, so both see the same machine); per step
  the wall time and this rank's compute time. The step waits for the slowest rank.
* ``overlap``: zigzag, causal, with the transfers overlapped and serialized (wait first, then
  compute), alternating; keeps every exchange and compute span of the last step of each
  (timestamps of ``time.perf_counter``, one clock for the processes of a machine) for a Gantt
  chart, and the time the serialized transfers took.
* ``exchange_sweep``: one ring exchange of growing size, serialized, for the alpha-beta fit
  of notebook 03 (costmodel.fit_alpha_beta).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from source_code.context_parallel import layout as lay
from source_code.context_parallel.comm import Ring
from source_code.context_parallel.harness import Shape, inputs
from source_code.context_parallel.ring import ring_attention
from source_code.distributed import context


@dataclass(frozen=True)
class TimingShape(Shape):
    batch: int = 1
    heads: int = 4
    seq: int = 1024
    head_dim: int = 32


def _wait(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dist.barrier()


def _step(q, k, v, dout, layout: str, causal: bool, overlap: bool) -> tuple[float, Ring]:
    """One forward + backward on this rank's tokens; (seconds between barriers, its ring)."""
    r, n = dist.get_rank(), dist.get_world_size()
    local = [lay.shard(t, r, n, layout).requires_grad_(True) for t in (q, k, v)]
    d_local = lay.shard(dout, r, n, layout)
    ring = Ring()
    _wait(q.device)
    t0 = time.perf_counter()
    out = ring_attention(*local, causal=causal, layout=layout, ring=ring, overlap=overlap)
    out.backward(d_local)
    _wait(q.device)
    return time.perf_counter() - t0, ring


def _compute_s(ring: Ring) -> float:
    return sum(c["end"] - c["start"] for c in ring.computes)


def step_times(shape: Shape = TimingShape(), steps: int = 10, warmup: int = 2) -> dict:
    q, k, v, dout = inputs(shape, context().device)
    times = {l: [] for l in lay.LAYOUTS}
    compute = {l: [] for l in lay.LAYOUTS}
    for i in range(warmup + steps):
        for layout in (lay.LAYOUTS if i % 2 == 0 else lay.LAYOUTS[::-1]):
            t, ring = _step(q, k, v, dout, layout, True, True)
            if i >= warmup:
                times[layout].append(t)
                compute[layout].append(_compute_s(ring))
    ratios = [a / b for a, b in zip(times["contiguous"], times["zigzag"])]
    return {"rank": dist.get_rank(), "times": times,
            "median": {l: statistics.median(t) for l, t in times.items()},
            "compute": {l: statistics.median(c) for l, c in compute.items()},
            "median_ratio": statistics.median(ratios)}


def overlap(shape: Shape = TimingShape(), steps: int = 10, warmup: int = 2) -> dict:
    q, k, v, dout = inputs(shape, context().device)
    times = {True: [], False: []}
    compute = {True: [], False: []}
    comm = []
    last = {}
    for i in range(warmup + steps):
        for ov in ((True, False) if i % 2 == 0 else (False, True)):
            t, ring = _step(q, k, v, dout, "zigzag", True, ov)
            if i >= warmup:
                times[ov].append(t)
                compute[ov].append(_compute_s(ring))
                if not ov:  # serialized: the waits are the transfers themselves
                    comm.append(sum(e["done"] - e["post"] for e in ring.events))
            last[ov] = {"events": ring.events, "computes": ring.computes}
    med = {ov: statistics.median(t) for ov, t in times.items()}
    comm_s = statistics.median(comm)
    return {"rank": dist.get_rank(), "overlapped": med[True], "serialized": med[False],
            "compute_overlapped": statistics.median(compute[True]),
            "compute_serialized": statistics.median(compute[False]),
            "comm_serialized": comm_s, "hidden": (med[False] - med[True]) / comm_s if comm_s else 0.0,
            "timeline": {"overlapped": last[True], "serialized": last[False]}}


def exchange_sweep(sizes=(1 << 10, 1 << 13, 1 << 16, 1 << 19, 1 << 21), repeats: int = 5) -> dict:
    """Median seconds of one serialized ring exchange of each size in bytes (fp32 buffers)."""
    ring = Ring()
    device = context().device
    out = {}
    for nbytes in sizes:
        buf = torch.zeros(nbytes // 4, device=device)
        ts = []
        for _ in range(repeats + 1):
            _wait(device)
            t0 = time.perf_counter()
            ring.exchange(buf, "kv", "sweep", 0).wait()
            ts.append(time.perf_counter() - t0)
        out[nbytes] = statistics.median(ts[1:])
    return {"rank": dist.get_rank(), "seconds": out}


def timing_report(shape: Shape = TimingShape(), steps: int = 10) -> dict:
    """All three, in one group (one start of the processes)."""
    return {"steps": step_times(shape, steps), "overlap": overlap(shape, steps),
            "sweep": exchange_sweep()}
