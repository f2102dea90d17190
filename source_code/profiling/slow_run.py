"""A slow training run to diagnose from its profile (notebook 15's exercise).

    python -m source_code.profiling.slow_run                  # the slow run's profile, per step
    python -m source_code.profiling.slow_run --workers 2      # the same run with other settings

One process on the CPU: SmallCNN on the digits with SGD, a batch of 64. Three suspects are in
its loop, each with a setting that changes how it runs without changing the work done:

* the data: every sample is "decoded" in the DataLoader (workload.SlowDigits, DECODE_ROUNDS
  blurs of a 64 x 64 image); ``workers`` loader processes can do that instead of this one;
* a host sync: ``loss.item()`` every ``item_every`` steps, for logging (on a GPU each one makes
  the CPU wait for every queued kernel);
* the model's own forward, backward and optimizer step.

Which one costs the time is for the profile to say; ``run(profile=True)`` returns the
profiler's per-step operator table and the median step time.
"""
from __future__ import annotations

import itertools
import statistics
import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, schedule
from torch.utils.data import DataLoader

from source_code import models
from source_code.cli import Parser, nonnegative_int, positive_int
from source_code.errors import run_main
from source_code.profiling import classify
from source_code.profiling.workload import SlowDigits

DECODE_ROUNDS = 4   # the work of loading a sample: fixed, a fix may not change it
BATCH = 64
SETTINGS = ("workers", "item_every")  # what a fix may change: how the work runs, not how much


def run(steps: int = 10, workers: int = 0, item_every: int = 1, warmup: int = 3,
        profile_steps: bool = False) -> dict:
    """``steps`` timed training steps after ``warmup`` untimed ones (first calls, workers starting);
    returns {"step_ms": median wall time, "cpu_ms": median CPU time of this (the training)
    process, "losses_read": how many .item() calls, "rows": per-step operator table when
    ``profile_steps``}."""
    if warmup < 1:
        raise ValueError("warmup >= 1: the first step (first calls, workers starting) is never timed")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as every script of this package: one core per process
    torch.manual_seed(0)
    loader = DataLoader(SlowDigits("train", rounds=DECODE_ROUNDS), batch_size=BATCH, shuffle=True,
                        num_workers=workers, generator=torch.Generator().manual_seed(0))
    model = models.SmallCNN(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    prof = (profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=warmup - 1, warmup=1, active=steps))
            if profile_steps else None)
    times, cpu, read = [], [], 0
    try:
        if prof:
            prof.start()
        batches = itertools.islice(iter(loader), warmup + steps)
        start, start_cpu = time.perf_counter(), time.process_time()
        for step, (x, y) in enumerate(batches):
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            if step % item_every == 0:
                last_loss = loss.item()  # logging  # noqa: F841
                read += 1
            end, end_cpu = time.perf_counter(), time.process_time()
            if step >= warmup:
                times.append(end - start)
                cpu.append(end_cpu - start_cpu)  # this process's CPU time: not its workers'
            if prof:
                prof.step()
            start, start_cpu = time.perf_counter(), time.process_time()
        del batches  # stops the loader's worker processes
    finally:
        if prof:
            prof.stop()
        torch.set_num_threads(threads)
    out = {"step_ms": 1e3 * statistics.median(times), "cpu_ms": 1e3 * statistics.median(cpu),
           "losses_read": read, "steps": steps,
           "workers": workers, "item_every": item_every}
    if prof:
        out["rows"] = classify.per_step(classify.op_rows(prof.key_averages()), steps)
    return out


def main(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=positive_int, default=4, help="profiled steps")
    p.add_argument("--workers", type=nonnegative_int, default=0, help="DataLoader worker processes")
    p.add_argument("--item-every", type=positive_int, default=1, help="read the loss every k steps")
    p.add_argument("--top", type=positive_int, default=14, help="rows of the operator table")
    args = p.parse_args(argv)
    r = run(args.steps, args.workers, args.item_every, warmup=2, profile_steps=True)
    print(classify.format_table(r["rows"], args.top, unit="ms per step"))
    print(f"summary: step_ms={r['step_ms']:.2f} cpu_ms={r['cpu_ms']:.2f} workers={args.workers} "
          f"item_every={args.item_every}")
    return 0


if __name__ == "__main__":
    run_main(main)
