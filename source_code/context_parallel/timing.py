"""Run on every rank (processes.spawn): what the layouts and the overlap cost in time.

* ``step_times``: forward + backward of causal ring attention, contiguous and zigzag
  alternating step by step (each between barriers, so both see the same machine); per step
  the wall time (the step waits for the slowest rank), this rank's time inside the block
  attention kernel, and the kernel calls' total time and count by phase and block size (to
  explain the compute ratio from the blocks a rank computes).
* ``overlap``: zigzag, causal, with the transfers overlapped and serialized (wait first, then
  compute), alternating; every exchange (post, wait returned) and compute span of every step,
  for a Gantt chart and for ``transfer_split``; between steps, the same K/V hop alone
  (``bare_hop``), to set the alpha-beta model's prediction against a hop measured at the same
  moments of the machine.
* ``exchange_sweep``: one ring exchange of growing size, serialized, for the alpha-beta fit
  of notebook 03 (costmodel.fit_alpha_beta); like the lone hops and the hops of a step, each
  is timed from when both neighbours had posted (``median_transfer``).

Times are ``measure.clock(device)`` (CUDA synchronised), read through probes.Probe, one clock
for all processes of a machine. ``transfer_split`` (in the notebook, over every rank's record)
splits an exchange's time from post to the wait's return into waiting for a neighbour that
has not posted its side yet, and the transfer itself (from when both neighbours had posted).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch
import torch.distributed as dist

from source_code.context_parallel import layout as lay
from source_code.context_parallel.harness import Shape, inputs, say
from source_code.context_parallel.probes import Probe
from source_code.context_parallel.ring import ring_attention
from source_code.distributed import context
from source_code.measure import clock


@dataclass(frozen=True)
class TimingShape(Shape):
    batch: int = 1
    heads: int = 4
    seq: int = 1024
    head_dim: int = 32


def _barrier(device) -> float:
    dist.barrier()
    return clock(device)


def _step(q, k, v, dout, layout: str, causal: bool, overlap: bool) -> tuple[float, Probe]:
    """One forward + backward on this rank's tokens; (seconds between barriers, its probe)."""
    r, n = dist.get_rank(), dist.get_world_size()
    local = [lay.shard(t, r, n, layout).requires_grad_(True) for t in (q, k, v)]
    d_local = lay.shard(dout, r, n, layout)
    probe = Probe(q.device)
    t0 = _barrier(q.device)
    out = ring_attention(*local, causal=causal, layout=layout, ring=probe.ring, overlap=overlap,
                         kernel=probe.kernel)
    probe.phase = "backward"
    out.backward(d_local)
    return _barrier(q.device) - t0, probe


def step_times(shape: Shape = TimingShape(), steps: int = 10, warmup: int = 2, verbose: bool = False) -> dict:
    q, k, v, dout = inputs(shape, context().device)
    times = {l: [] for l in lay.LAYOUTS}
    compute = {l: [] for l in lay.LAYOUTS}
    block_s, blocks = {}, {}
    for i in range(warmup + steps):
        for layout in (lay.LAYOUTS if i % 2 == 0 else lay.LAYOUTS[::-1]):
            t, probe = _step(q, k, v, dout, layout, True, True)
            if i >= warmup:
                times[layout].append(t)
                compute[layout].append(probe.compute_s())
                for c in probe.calls:
                    block_s.setdefault((c["phase"], c["computed"]), []).append(c["end"] - c["start"])
                blocks[layout] = [(c["phase"], c["computed"]) for c in probe.calls]
    ratios = [a / b for a, b in zip(times["contiguous"], times["zigzag"])]
    say(f"{steps} steps of each layout timed", verbose)
    return {"rank": dist.get_rank(), "times": times,
            "median": {l: statistics.median(t) for l, t in times.items()},
            "compute": {l: statistics.median(c) for l, c in compute.items()},
            "block_s": {key: (sum(ts), len(ts)) for key, ts in block_s.items()},   # (seconds, calls)
            "blocks": blocks, "median_ratio": statistics.median(ratios)}


def overlap(shape: Shape = TimingShape(), steps: int = 10, warmup: int = 2, verbose: bool = False) -> dict:
    device = context().device
    q, k, v, dout = inputs(shape, device)
    record = {True: [], False: []}
    bare = []
    for i in range(warmup + steps):
        for ov in ((True, False) if i % 2 == 0 else (False, True)):
            t, probe = _step(q, k, v, dout, "zigzag", True, ov)
            if i >= warmup:
                record[ov].append({"time": t, "compute": probe.compute_s(),
                                   "exchanges": probe.exchanges, "spans": probe.spans()})
        hop = torch.stack([k, v])[:, :, :, : shape.seq // dist.get_world_size()]   # one K/V block
        lone = _lone_hop(hop, device)            # the same hop alone, at the same moments
        if i >= warmup:
            bare.append(lone)
    say(f"{steps} steps overlapped and {steps} serialized timed", verbose)
    return {"rank": dist.get_rank(), "overlapped": record[True], "serialized": record[False], "lone": bare}


def _lone_hop(t: torch.Tensor, device) -> dict:
    """One exchange of ``t`` after a barrier, recorded like the exchanges of a step."""
    probe = Probe(device)
    _barrier(device)
    probe.ring.exchange(t, "kv").wait()
    return {"exchanges": probe.exchanges}


def exchange_sweep(sizes=(1 << 10, 1 << 13, 1 << 16, 1 << 18, 1 << 19, 1 << 20, 1 << 21), repeats: int = 9,
                   verbose: bool = False) -> dict:
    """``repeats`` recorded ring exchanges of each size in bytes (fp32 buffers), after one
    untimed; ``median_transfer`` over every rank's records gives the seconds per size."""
    device = context().device
    out = {}
    for nbytes in sizes:
        buf = torch.zeros(nbytes // 4, device=device)
        out[nbytes] = [_lone_hop(buf, device) for _ in range(repeats + 1)][1:]
    say(f"ring exchanges of {len(sizes)} sizes timed", verbose)
    return {"rank": dist.get_rank(), "records": out}


def timing_report(shape: Shape = TimingShape(), steps: int = 10, verbose: bool = False) -> dict:
    """All three, in one group (one start of the processes)."""
    return {"steps": step_times(shape, steps, verbose=verbose),
            "overlap": overlap(shape, steps, verbose=verbose),
            "sweep": exchange_sweep(verbose=verbose)}


# ------------------------------------------------------------------ over every rank's record
def transfer_split(per_rank: list[list[dict]]) -> list[list[dict]]:
    """``per_rank[r][i]``: rank r's record of step i (overlap()'s list). Returns, for each step,
    every exchange with ``start`` = when both neighbours had posted (the data can only move
    then), ``waiting`` = start - post (a neighbour had not posted yet) and ``transfer`` =
    done - start (in a serialized step, the transfer itself; overlapped, also the compute the
    transfer ran beside, since the wait is called after it)."""
    n = len(per_rank)
    steps = []
    for i in range(len(per_rank[0])):
        posts = {(r, e["what"], e["phase"], e["step"]): e["post"]
                 for r in range(n) for e in per_rank[r][i]["exchanges"]}
        rows = []
        for r in range(n):
            for e in per_rank[r][i]["exchanges"]:
                key = (e["what"], e["phase"], e["step"])
                start = max(e["post"], posts[((r - 1) % n, *key)], posts[((r + 1) % n, *key)])
                rows.append({**e, "rank": r, "start": start, "waiting": start - e["post"],
                             "transfer": e["done"] - start})
        steps.append(rows)
    return steps


def median_transfer(per_rank: list[list[dict]]) -> float:
    """Median over every rank's exchanges of their transfer time (both neighbours posted until
    the wait returned); ``per_rank[r]``: rank r's records, each with its ``exchanges``."""
    return statistics.median(e["transfer"] for rows in transfer_split(per_rank) for e in rows)


def hidden_fraction(per_rank_ov: list[list[dict]], per_rank_ser: list[list[dict]]) -> dict:
    """Medians over steps of the overlapped and serialized step times, of the kernel time
    (mean over ranks) and of the serialized transfers (per step: the sum of a rank's transfer
    times, mean over ranks), and hidden = (serialized - overlapped - (kernel serialized -
    kernel overlapped)) / transfers: the step time saved, less what the kernel itself happened
    to save or lose between the two modes, per second of transfer."""
    n = len(per_rank_ser)
    ov = statistics.median(s["time"] for s in per_rank_ov[0])
    ser = statistics.median(s["time"] for s in per_rank_ser[0])
    kern = {mode: statistics.median(sum(rec[i]["compute"] for rec in recs) / n for i in range(len(recs[0])))
            for mode, recs in (("overlapped", per_rank_ov), ("serialized", per_rank_ser))}
    split = transfer_split(per_rank_ser)
    transfers = [sum(e["transfer"] for e in rows) / n for rows in split]
    waits = [sum(e["waiting"] for e in rows) / n for rows in split]
    comm = statistics.median(transfers)
    saved = ser - ov - (kern["serialized"] - kern["overlapped"])
    return {"overlapped": ov, "serialized": ser, "transfers": comm, "waiting": statistics.median(waits),
            "kernel": kern, "hops": len(split[0]) // n, "hidden": saved / comm if comm > 0 else 0.0}
