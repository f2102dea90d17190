"""Straggler and hang drills on CPU processes: one rank made slow, then one rank made to hang.

    python -m source_code.resilience.health_drill --world-size 3 --slow-rank 2 --hang-rank 1

Data-parallel training (gradients all-reduced, written out) on ``--world-size`` processes:
* for ``--steps`` steps ``--slow-rank`` sleeps ``--slow-seconds`` in every step before the
  all-reduce (a throttled GPU, a noisy neighbour); every ``--every`` steps the ranks all-gather
  their median compute time (stragglers.py) and the slow one is named;
* then ``--hang-rank`` stops in its data phase; the watchdog thread of every rank (watchdog.py)
  notices that nothing moved for ``--hang-timeout`` seconds and reports where each rank is.
"""
from __future__ import annotations

import datetime
import os
import threading
import time

import torch
import torch.distributed as dist

from source_code import processes, workload
from source_code.cli import Parser, nonnegative_int, positive_float, positive_int
from source_code.errors import LaunchError, run_main
from source_code.resilience import common, stragglers
from source_code.resilience.watchdog import Watchdog


def _store():
    client = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                           wait_for_workers=False, timeout=datetime.timedelta(seconds=60))
    return dist.PrefixStore("health_drill", client)


def _rank_drill(steps, every, slow_rank, slow_s, hang_rank, hang_timeout_s, batch_size=24) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    dataset = common.task()
    model, optimizer = common.build(0)
    times, named, gather_s = stragglers.StepTimes(), [], []
    released, reports = threading.Event(), []

    def on_hang(report):                     # production: print it, then os._exit(1)
        reports.append(report)
        released.set()                       # the drill: let the simulated hang end

    with Watchdog(_store(), rank, world, hang_timeout_s, on_hang) as dog:
        for step in range(steps + 1):        # the last step is the hang drill's
            t0 = time.perf_counter()
            dog.at(step, "data")
            if step == steps and rank == hang_rank:
                released.wait(timeout=60)    # the hang (a stuck read, a deadlocked loader)
            x, y = common.part_batch(dataset, step, batch_size, world, rank)
            dog.at(step, "forward_backward")
            optimizer.zero_grad()
            workload.loss_fn(model, x, y).backward()
            if rank == slow_rank and step < steps:
                time.sleep(slow_s)           # the straggler
            times.add(time.perf_counter() - t0)
            dog.at(step, "all_reduce")
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world
            optimizer.step()
            if (step + 1) % every == 0 and step < steps:
                g0 = time.perf_counter()
                medians = stragglers.gather_medians(times)
                gather_s.append(time.perf_counter() - g0)
                named.append({"step": step, "medians": medians, "slow": stragglers.name_stragglers(medians)})
        dog.at(steps, "done")
    return {"named": named, "gather_seconds": sorted(gather_s)[len(gather_s) // 2] if gather_s else 0.0,
            "report": reports[0] if reports else None}


def drill(world_size=3, steps=8, every=4, slow_rank=2, slow_s=0.05, hang_rank=1, hang_timeout_s=1.0,
          stream=None) -> dict:
    if not (0 <= slow_rank < world_size and 0 <= hang_rank < world_size):
        raise ValueError("slow_rank and hang_rank must be ranks of the world")
    if world_size < 2 or every > steps:
        raise ValueError("needs world_size >= 2 and every <= steps")
    out = processes.spawn(_rank_drill, world_size, steps, every, slow_rank, slow_s, hang_rank,
                          hang_timeout_s, device="cpu", stream=stream)
    # the hung rank's own watchdog report: taken while it still hangs (the others wait in the
    # all-reduce for it), before the drill releases it; another rank's report may come a moment
    # after the release and find the hung rank already in the all-reduce
    report = out[hang_rank]["report"]
    stuck_outside = [r for r, m in (report or {}).items() if m["phase"] != "all_reduce"]
    return {"named": out[0]["named"], "gather_seconds": out[0]["gather_seconds"], "report": report,
            "hang_named": stuck_outside, "slow_rank": slow_rank, "hang_rank": hang_rank}


def main(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--world-size", type=positive_int, default=3)
    p.add_argument("--steps", type=positive_int, default=8)
    p.add_argument("--every", type=positive_int, default=4)
    p.add_argument("--slow-rank", type=nonnegative_int, default=2)
    p.add_argument("--slow-seconds", type=positive_float, default=0.05)
    p.add_argument("--hang-rank", type=nonnegative_int, default=1)
    p.add_argument("--hang-timeout", type=positive_float, default=1.0)
    a = p.parse_args(argv)
    if a.world_size < 2 or a.slow_rank >= a.world_size or a.hang_rank >= a.world_size:
        raise LaunchError("error: --world-size must be >= 2 and --slow-rank/--hang-rank below it")
    if a.every > a.steps:
        raise LaunchError("error: --every must be <= --steps (the gather happens every K steps)")
    r = drill(a.world_size, a.steps, a.every, a.slow_rank, a.slow_seconds, a.hang_rank, a.hang_timeout)
    where = " ".join(f"rank{k}={v['phase']}@{v['step']}" for k, v in (r["report"] or {}).items())
    print(f"summary: straggler_named={r['named'][-1]['slow']} gather_ms={1e3 * r['gather_seconds']:.2f} "
          f"hang_named={r['hang_named']} {where}")
    return 0


if __name__ == "__main__":
    run_main(main)
