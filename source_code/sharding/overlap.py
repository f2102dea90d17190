"""FSDP2 prefetching: issue the next block's all-gather earlier, read the overlap in a trace.

    torchrun --standalone --nproc-per-node=2 -m source_code.sharding.overlap --out overlap.json

On GPUs FSDP2 overlaps by default: the all-gathers run on their own CUDA stream, and the CPU,
running ahead of the kernels, issues block i+1's all-gather while block i's kernels still run
(_fsdp_param_group.py, "implicit prefetching"). ``block.set_modules_to_forward_prefetch([next])``
keeps that overlap and only issues the all-gather earlier from the CPU (after block i's own
all-gather, before block i computes); a list of two or more modules gathers further ahead, with
more memory (its docstring). ``set_modules_to_backward_prefetch([previous_block])`` chooses the
order in backward (FSDP2 prefetches one block there by default, in the reverse of the forward).
On a CPU nothing runs ahead: FSDP2 issues the gloo collective synchronously, so the main thread
waits for it, prefetched or not, unless the group is told to issue it asynchronously
(``FSDPModule._set_unshard_async_op(True)``, private in torch 2.14); then gloo's worker thread
moves the bytes while the main thread computes. Three variants run here: ``none`` (FSDP2's
default), ``prefetch`` (explicit lists) and ``prefetch_async`` (explicit lists + asynchronous issue).

Rank 0 profiles ``--steps`` steps of each variant after a warm-up, exports the Chrome trace and
reads it with the profiling lesson's classifier (source_code/profiling/classify.py):
the transfers (gloo's events for each collective, until its worker thread completes it: the
wait for the slower rank included), the main thread's computation
(operators, except the collective calls and every operator that contains one: an autograd node
whose FSDP hook issues an all-gather and waits for it is waiting, not computing), and how much
of the transfer time lies under computation (``hidden``; transfer_and_compute). It also checks
what is resident when: at each block's forward, the blocks whose parameters are unsharded and the
all-gathers already issued (one ahead of the block with prefetching).

The three variants' steps are interleaved in one profiled run (each variant in each position
of a round in turn), and each step is timed alone: not the profiler's warm-up step, not the
trace's export. Written to ``--out`` (JSON): {"variants": {name: {comm_ms, hidden_ms,
hidden_fraction, gather_ms, gather_hidden_fraction, step_ms, step_ms_each, ahead,
unsharded_blocks, calls, payload}}, "world_size", "device"} (times in ms per step; the
all-gathers apart, as prefetching moves only them; calls and payload bytes per collective kind,
counted in the warm-up step).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time
import warnings

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from source_code.distributed import print0, run_main, session
from source_code.profiling import classify
from source_code import workload
from source_code.sharding.fsdp import build_sharded
from source_code.measure import CommCounter, is_dtensor

LAUNCH = "torchrun --standalone --nproc-per-node=2 -m source_code.sharding.overlap"
VARIANTS = ("none", "prefetch", "prefetch_async")


def set_prefetch(model, async_op: bool = False) -> None:
    """Forward: block i prefetches block i+1; backward: block i prefetches block i-1."""
    blocks = list(model.layers)
    for i, block in enumerate(blocks):
        if i + 1 < len(blocks):
            block.set_modules_to_forward_prefetch([blocks[i + 1]])
        if i > 0:
            block.set_modules_to_backward_prefetch([blocks[i - 1]])
    if async_op:  # private in torch 2.14: issue the all-gathers with async_op=True
        for module in [*blocks, model]:
            module._set_unshard_async_op(True)


def watch_residency(model, counter: CommCounter) -> list[dict]:
    """At each block's forward (after FSDP2's own pre-forward hook): which blocks hold full
    parameters, and how many all-gathers have been issued so far."""
    seen: list[dict] = []
    blocks = list(model.layers)

    def hook(index):
        def pre_forward(module, args):
            full = [j for j, b in enumerate(blocks)
                    if not any(is_dtensor(p) for p in b.parameters())]
            seen.append({"block": index, "unsharded": full,
                         "gathers_issued": counter.calls["all_gather"]})
        return pre_forward

    for i, block in enumerate(blocks):
        block.register_forward_pre_hook(hook(i))   # registered after fully_shard: runs after it
    return seen


def transfer_and_compute(trace: dict, which: str = "", windows=None):
    """Merged spans of (collectives in flight on the backend's thread, main-thread computation).

    The transfer: the ``gloo:...`` (``nccl:...``) events, the bytes on the move (and the wait for
    the slower rank). Computation: operators on the thread that runs the steps, except the
    collective calls there, the operators inside them (the copies of the call itself) and the
    operators that contain one (an autograd node whose hook issues a collective and waits for it):
    a transfer under those is not hidden behind work.
    ``which``: only the collectives whose name contains it (e.g. "all_gather"); ``windows``: only
    the events that start inside one of these (start_us, end_us) spans (some steps of the trace).
    """
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    if windows is not None:
        events = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")
                  or any(lo <= float(e["ts"]) < hi for lo, hi in windows)]
    main = next(e["tid"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#"))
    span = lambda e: (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)))
    transfer = [span(e) for e in events if str(e["name"]).startswith(classify.ASYNC_COLLECTIVE)
                and which in str(e["name"])]
    call_spans = [span(e) for e in events if e["tid"] == main and e.get("cat") == "cpu_op"
                  and classify.kind_of(e["name"]) == "communication"]
    calls = classify.merge(call_spans)
    inside = lambda a, b: any(lo <= a and b <= hi for lo, hi in calls)
    holds_call = lambda a, b: any(a <= lo and hi <= b for lo, hi in call_spans)
    compute = [span(e) for e in events if e["tid"] == main and e.get("cat") == "cpu_op"
               and classify.kind_of(e["name"]) == "computation"
               and not inside(*span(e)) and not holds_call(*span(e))]
    return classify.merge(transfer), classify.merge(compute)


def build_variant(ctx, cfg, name: str) -> dict:
    """One FSDP2 model set up as variant ``name``, after a warm-up step (lazy init) that also
    records what is resident at each block's forward and the collectives of one step."""
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    model = build_sharded(cfg, mesh, 0, ctx.device)
    if name != "none":
        set_prefetch(model, async_op=name == "prefetch_async")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    counter = CommCounter(ctx.world_size)
    seen = watch_residency(model, counter)
    x, y = workload.rank_slice(workload.global_batch(workload.sort_task(256), 0, 32),
                               ctx.rank, ctx.world_size)

    def step():
        workload.loss_fn(model, x, y).backward()
        opt.step()
        opt.zero_grad()

    with counter:
        step()                                          # warm-up (lazy init), and the residency
    first_forward = list(seen)
    # all-gathers issued beyond the blocks started so far (the root's one included)
    ahead = max(s["gathers_issued"] - (s["block"] + 2) for s in first_forward)
    return {"step": step, "ahead": ahead,
            "unsharded_blocks": max(len(s["unsharded"]) for s in first_forward),
            "calls": dict(counter.calls), "payload": dict(counter.payload)}


def run_variants(ctx, cfg, steps: int, trace_dir: str) -> dict:
    """The variants' steps interleaved in one profiled run, each variant in each position of a
    round in turn; each step timed alone (not the profiler's warm-up step, not its export)."""
    built = {name: build_variant(ctx, cfg, name) for name in VARIANTS}
    rounds = [VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)] for r in range(steps)]
    order = [name for names in rounds for name in names]
    times = {name: [] for name in VARIANTS}
    from torch.profiler import ProfilerActivity, profile, schedule
    path = os.path.join(trace_dir, f"overlap-rank{ctx.rank}.json")
    sched = schedule(wait=0, warmup=1, active=len(order))
    with profile(activities=[ProfilerActivity.CPU], schedule=sched,
                 on_trace_ready=lambda prof: prof.export_chrome_trace(path)) as prof:
        built[order[-1]]["step"]()                      # the profiler's warm-up step: not timed
        prof.step()
        for name in order:
            t0 = time.perf_counter()
            built[name]["step"]()
            times[name].append(time.perf_counter() - t0)
            prof.step()                                 # the last one exports the trace
    trace = classify.load_trace(path)
    windows = classify.step_windows(trace)              # one per timed step, in order
    assert len(windows) == len(order), (len(windows), len(order))
    out = {}
    for name in VARIANTS:
        mine = [w for w, n in zip(windows, order) if n == name]
        comm, comp = transfer_and_compute(trace, windows=mine)
        gather, _ = transfer_and_compute(trace, "all_gather", windows=mine)
        comm_us, hidden_us = classify.busy_us(comm), classify.overlap_us(comm, comp)
        b = built[name]
        out[name] = {"comm_ms": comm_us / 1e3 / steps, "hidden_ms": hidden_us / 1e3 / steps,
                     "hidden_fraction": hidden_us / comm_us if comm_us else 0.0,
                     "gather_ms": classify.busy_us(gather) / 1e3 / steps,
                     "gather_hidden_fraction": (classify.overlap_us(gather, comp) / classify.busy_us(gather)
                                                if gather else 0.0),
                     "step_ms": 1e3 * sum(times[name]) / steps,
                     "step_ms_each": [1e3 * t for t in times[name]], "ahead": b["ahead"],
                     "unsharded_blocks": b["unsharded_blocks"], "calls": b["calls"], "payload": b["payload"]}
    return out


# Student's t, two-sided 95 %, by degrees of freedom (rounds - 1); beyond the table, 10's (larger)
T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23}


def paired_gap(first: list[float], second: list[float]) -> dict:
    """``second`` minus ``first`` round by round (step_ms_each of two variants: one step each per
    round, interleaved), their mean and its standard error, and ``resolved``: the mean further
    from 0 than Student's t (95 %) standard errors, which few rounds rarely allow."""
    diffs = [b - a for a, b in zip(first, second)]
    n = len(diffs)
    mean = sum(diffs) / n
    se = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1) / n) if n > 1 else math.inf
    t = T95.get(n - 1, T95[10])
    return {"diffs": diffs, "mean": mean, "se": se, "t": t, "resolved": abs(mean) > t * se}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--steps", type=int, default=3, help="profiled steps per variant")
    p.add_argument("--out", default="", help="write the results here (JSON, rank 0)")
    args = p.parse_args(argv)
    if args.dim % 4 or args.layers < 2 or args.steps < 1:
        p.error("--dim must be a multiple of 4, --layers >= 2 and --steps >= 1")
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*Profiler clears events")
    with session(launch_hint=LAUNCH) as ctx:
        cfg = workload.model_config(dim=args.dim, n_layers=args.layers)
        result = {"world_size": ctx.world_size, "device": ctx.device.type, "variants": {}}
        with tempfile.TemporaryDirectory(prefix="fsdp-trace-") as trace_dir:
            result["variants"] = run_variants(ctx, cfg, args.steps, trace_dir)
            for name, r in result["variants"].items():
                print0(f"overlap: variant={name} " + " ".join(
                    f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))
        if ctx.rank == 0 and args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)
        dist.barrier()
    return 0


if __name__ == "__main__":
    run_main(main)
