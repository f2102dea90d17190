"""Samples per second of DDP training, with the time spent waiting for data measured apart.

    torchrun --standalone --nproc-per-node=1 -m source_code.profiling.throughput --per-rank-batch 64
    torchrun --standalone --nproc-per-node=2 -m source_code.profiling.throughput --per-rank-batch 64   # weak
    torchrun --standalone --nproc-per-node=2 -m source_code.profiling.throughput --global-batch 64     # strong
    torchrun --standalone --nproc-per-node=1 -m source_code.profiling.throughput --decode-rounds 30 --workers 2

Every step is timed in two parts: waiting for the next batch (the DataLoader) and the rest
(forward, backward with DDP's all-reduce, optimizer). ``--decode-rounds`` makes loading a
sample cost CPU time (workload.SlowDigits); ``--workers`` moves that work into loader processes.
``data_wait_cpu_ms``: the CPU time the training process itself spends getting a batch (median
per step): the decoding it does with ``--workers 0``, gone from it with workers, whatever the
machine's load does to the wait on the clock; ``step_cpu_ms``: the same over the whole step.
"""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data.distributed import DistributedSampler

from source_code import models
from source_code.cli import Parser, nonnegative_int, positive_int, writable_path
from source_code.distributed import run_main, session
from source_code.errors import LaunchError
from source_code.profiling.monitor import Progress
from source_code.profiling.workload import SlowDigits, batches
from source_code.training import loop

LAUNCH = "torchrun --standalone --nproc-per-node=2 -m source_code.profiling.throughput"


def measure(ctx, args) -> dict:
    per_rank = (loop.per_rank_batch(args.global_batch, ctx.world_size) if args.global_batch
                else args.per_rank_batch)
    dataset = SlowDigits("train", rounds=args.decode_rounds)
    sampler = DistributedSampler(dataset, num_replicas=ctx.world_size, rank=ctx.rank, seed=0)
    loader = loop.loader(dataset, per_rank, ctx.device, args.workers, sampler=sampler)
    torch.manual_seed(0)
    model = DDP(models.SmallCNN(1, width=args.width).to(ctx.device), device_ids=ctx.device_ids)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    progress = Progress(args.steps, enabled=ctx.is_main and not args.quiet, every=max(args.steps // 2, 1))
    it = batches(loader, sampler)
    wait_s, step_s, wait_cpu_s, step_cpu_s = [], [], [], []
    for step in range(args.warmup + args.steps):
        if step == args.warmup:  # the clock starts after the warm-up (first calls, worker start-up)
            progress.start = start = time.perf_counter()
        t0, c0 = time.perf_counter(), time.process_time()
        x, y = next(it)
        t1, c1 = time.perf_counter(), time.process_time()
        x, y = x.to(ctx.device, non_blocking=True), y.to(ctx.device, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
        if ctx.device.type == "cuda":
            torch.cuda.synchronize()
        t2, c2 = time.perf_counter(), time.process_time()
        if step >= args.warmup:
            wait_s.append(t1 - t0)
            wait_cpu_s.append(c1 - c0)   # this process's own CPU while it got the batch
            step_s.append(t2 - t0)
            step_cpu_s.append(c2 - c0)   # this process's CPU over the whole step, every thread
            progress.update(step - args.warmup + 1, (step - args.warmup + 1) * per_rank * ctx.world_size)
    seconds = time.perf_counter() - start
    progress.close()
    global_batch = per_rank * ctx.world_size
    return {"rank": ctx.rank, "world_size": ctx.world_size, "per_rank_batch": per_rank,
            "global_batch": global_batch, "workers": args.workers, "decode_rounds": args.decode_rounds,
            "steps": args.steps, "seconds": seconds,
            "samples_per_s": args.steps * global_batch / seconds,
            "step_ms": 1e3 * statistics.median(step_s), "data_wait_ms": 1e3 * statistics.median(wait_s),
            "data_wait_share": sum(wait_s) / sum(step_s),
            "data_wait_cpu_ms": 1e3 * statistics.median(wait_cpu_s),
            "step_cpu_ms": 1e3 * statistics.median(step_cpu_s)}


def summary(r: dict) -> str:
    return (f"summary: world_size={r['world_size']} global_batch={r['global_batch']} "
            f"per_rank_batch={r['per_rank_batch']} workers={r['workers']} "
            f"decode_rounds={r['decode_rounds']} samples_per_s={r['samples_per_s']:.1f} "
            f"step_ms={r['step_ms']:.2f} data_wait_ms={r['data_wait_ms']:.2f} "
            f"data_wait_share={r['data_wait_share']:.3f} data_wait_cpu_ms={r['data_wait_cpu_ms']:.2f} "
            f"step_cpu_ms={r['step_cpu_ms']:.2f}")


def parser() -> Parser:
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--per-rank-batch", type=positive_int, default=64,
                   help="samples per process per step (weak scaling: the global batch grows)")
    p.add_argument("--global-batch", type=nonnegative_int, default=0,
                   help="if set: samples per step over all processes (strong scaling)")
    p.add_argument("--steps", type=positive_int, default=20, help="timed steps")
    p.add_argument("--warmup", type=nonnegative_int, default=3, help="untimed steps first")
    p.add_argument("--workers", type=nonnegative_int, default=0, help="DataLoader worker processes per rank")
    p.add_argument("--decode-rounds", type=nonnegative_int, default=0,
                   help="CPU work per loaded sample (5x5 blurs of a 64x64 image); 0: free")
    p.add_argument("--width", type=positive_int, default=32, help="SmallCNN width (compute per sample)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--out", type=writable_path, default="", help="also write rank 0's result as JSON")
    return p


def measure_spawned(argv) -> dict:
    """``measure`` on a rank started by ``processes.spawn`` (the process group already formed):
    the flags of the command line, as a list; rank 0 prints the summary line. A rank forks from
    the fork server, which has imported torch once: a short measurement costs a fraction of a
    second to start instead of a torchrun launch's seconds."""
    from source_code.distributed import context
    args = check(parser().parse_args([str(a) for a in argv]))
    torch.set_num_threads(1)
    result = measure(context(), args)
    if result["rank"] == 0:
        print(summary(result), flush=True)
    return result


def check(args):
    if args.warmup == 0 and args.workers:
        raise LaunchError("error: --workers needs --warmup >= 1 (worker start-up is not throughput)")
    return args


def main(argv=None):
    args = check(parser().parse_args(argv))
    torch.set_num_threads(1)
    with session(launch_hint=LAUNCH) as ctx:
        result = measure(ctx, args)
    if result["rank"] == 0:
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=1))
        print(summary(result), flush=True)
    return 0


if __name__ == "__main__":
    run_main(main)
