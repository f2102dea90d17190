"""torch.profiler on the DDP training job: per-operator table and one Chrome trace per rank.

    torchrun --standalone --nproc-per-node=2 -m source_code.profiling.profile_ddp --trace-dir traces
    torchrun --standalone --nproc-per-node=2 -m source_code.profiling.profile_ddp --wait 2 --warmup 2 --active 5

The model, data, loader and optimizer are built by the functions of source_code/training/
(the same job as ``source_code.training.ddp``, same flags). The profiler skips ``--wait``
steps, records but discards ``--warmup`` steps (first-call costs), and keeps ``--active`` steps.
Open traces/rank0.json in https://ui.perfetto.dev or chrome://tracing.

Every number it prints is a mean per active step: the operator table (the profiler's totals
over the active steps divided by their number), the split read from each rank's trace
(``classify.step_breakdown``: computing, a collective in flight, both at once, the main thread
waiting) and ``step_ms``, the wall time of the active steps alone (the skipped and warm-up
steps, the profiler's start-up and ``prof.step()``, which writes the trace, are not in it). On a GPU the table adds up the GPU's time
(``classify.op_rows``: the host's times there are kernel launches), and each step's clock is
read after ``torch.cuda.synchronize``: the CPU runs ahead of the GPU, so a clock read right
after a step would miss the work still queued.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile, record_function, schedule
from torch.utils.data.distributed import DistributedSampler

from source_code import data
from source_code.cli import Parser, nonnegative_int, positive_int, writable_path
from source_code.distributed import run_main, session
from source_code.profiling import classify
from source_code.profiling.workload import batches
from source_code.training import loop

LAUNCH = "torchrun --standalone --nproc-per-node=2 -m source_code.profiling.profile_ddp"


def finished(device) -> float:
    """perf_counter() once ``device`` has done its queued work (on a GPU: synchronise first)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def profiled_steps(ctx, args) -> dict:
    batch = loop.per_rank_batch(args.batch_size, ctx.world_size)
    train_set = data.load(args.dataset, "train", args.data_dir)
    sampler = DistributedSampler(train_set, num_replicas=ctx.world_size, rank=ctx.rank, seed=args.seed)
    loader = loop.loader(train_set, batch, ctx.device, args.workers, sampler=sampler)
    model, opt = loop.build(args, ctx.device)
    model = DDP(model, device_ids=ctx.device_ids)

    trace_path = Path(args.trace_dir) / f"rank{ctx.rank}.json"
    trace_path.parent.mkdir(parents=True, exist_ok=True)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ctx.device.type == "cuda" else [])
    n_steps = args.wait + args.warmup + args.active
    step_s = []
    with profile(activities=activities,
                 schedule=schedule(wait=args.wait, warmup=args.warmup, active=args.active, repeat=1),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(trace_path)),
                 record_shapes=True) as prof:
        start = finished(ctx.device)
        for step, (x, y) in zip(range(n_steps), batches(loader, sampler)):
            with record_function("data to device"):
                x, y = x.to(ctx.device, non_blocking=True), y.to(ctx.device, non_blocking=True)
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()  # DDP's hooks start all-reduces of gradient buckets in here
            opt.step()
            if step >= args.wait + args.warmup:  # an active step: its wall time counts
                step_s.append(finished(ctx.device) - start)
            prof.step()      # tells the schedule that a step ended (the last one writes the trace)
            start = finished(ctx.device)
    rows = classify.per_step(classify.op_rows(prof.key_averages()), args.active)
    mine = {"rank": ctx.rank, "totals": classify.totals(rows), "trace": str(trace_path),
            "step_ms": 1e3 * sum(step_s) / len(step_s),
            "breakdown": classify.step_breakdown(classify.load_trace(trace_path))}
    everyone = [None] * ctx.world_size
    dist.all_gather_object(everyone, mine)  # rank 0 reports every rank's totals
    return {"rank": ctx.rank, "rows": rows, "clock": classify.clock(rows), "ranks": everyone,
            "world_size": ctx.world_size,
            "backend": ctx.backend, "device": str(ctx.device),
            "schedule": {"wait": args.wait, "warmup": args.warmup, "active": args.active}}


def report(result: dict, top: int) -> str:
    lines = [f"profiled {result['schedule']['active']} active steps (after {result['schedule']['wait']} "
             f"skipped and {result['schedule']['warmup']} warm-up), world_size={result['world_size']}, "
             f"{result['backend']} on {result['device']}; rank 0's operators by "
             f"{'GPU (device) time' if result['clock'] == 'device' else 'self time'}, per step:",
             classify.format_table(result["rows"], top, unit="ms per step")]
    for r in result["ranks"]:
        b = r["breakdown"]
        lines.append(f"rank {r['rank']} per step (trace): {b['step']:.2f} ms, computing {b['computing']:.2f} ms, "
                     f"a collective in flight {b['communicating']:.2f} ms, of which while computing "
                     f"{b['overlap']:.2f} ms; main thread outside any operator {b['main_idle']:.2f} ms, "
                     f"of which while a collective was in flight {b['main_idle_comm']:.2f} ms")
    for r in result["ranks"]:
        lines.append(f"rank {r['rank']}: trace written to {os.path.abspath(r['trace'])}")
    return "\n".join(lines)


def main(argv=None):
    parser = loop.add_common_args(Parser(description=__doc__.splitlines()[0]))
    parser.add_argument("--trace-dir", type=writable_path, default="traces",
                        help="where each rank writes rankN.json (Chrome/Perfetto trace)")
    parser.add_argument("--wait", type=nonnegative_int, default=1, help="steps not recorded")
    parser.add_argument("--warmup", type=nonnegative_int, default=1, help="steps recorded, then discarded")
    parser.add_argument("--active", type=positive_int, default=3, help="steps recorded and kept")
    parser.add_argument("--top", type=positive_int, default=15, help="rows of the operator table")
    parser.add_argument("--out", type=writable_path, default="", help="also write the results as JSON")
    args = parser.parse_args(argv)
    loop.check_args(args)
    torch.set_num_threads(1)
    with session(launch_hint=LAUNCH, seed=args.seed) as ctx:
        result = profiled_steps(ctx, args)
    if result["rank"] != 0:  # the group is gone: print0 cannot tell ranks apart any more
        return 0
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    r0 = result["ranks"][0]
    print(report(result, args.top))
    print(f"summary: world_size={result['world_size']} active_steps={args.active} "  # means per active step
          f"compute_ms={r0['totals']['computation']:.2f} comm_ms={r0['totals']['communication']:.2f} "
          f"overlap_ms={r0['breakdown']['overlap']:.2f} step_ms={r0['step_ms']:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    run_main(main)
