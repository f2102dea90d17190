"""Straggler and hang drills on CPU processes: one rank made slow, then one rank made to hang.

    python -m source_code.resilience.health_drill --world-size 3 --slow-rank 2 --hang-rank 1

Data-parallel training (gradients all-reduced, written out) on ``--world-size`` processes:
* for ``--steps`` steps ``--slow-rank`` computes at ``1/--slow-factor`` of the others' speed (it
  runs its forward and backward that many times: a throttled GPU, a slower device); each rank
  times its compute in the CPU time of its own thread (a GPU would use CUDA events: the device's
  time, gaps where the host launches late included), so that the other processes on this machine
  do not count; every ``--every`` steps the ranks all-gather their median compute time
  (stragglers.py) and the slow one is named;
* then ``--hang-rank`` stops in its data phase; the watchdog of every rank (watchdog.py), armed
  for that step only with a timeout of ``--hang-factor`` x the slowest rank's median step time
  measured in this run, notices that nothing moved and reports where each rank is.
"""
from __future__ import annotations

import datetime
import os
import statistics
import threading
import time

import torch.distributed as dist

from source_code import processes, workload
from source_code.cli import Parser, nonnegative_int, positive_float, positive_int
from source_code.errors import LaunchError, run_main
from source_code.resilience import common, stragglers
from source_code.resilience.watchdog import Watchdog, stuck_outside

MIN_HANG_TIMEOUT_S = 0.25


def _store():
    client = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                           wait_for_workers=False, timeout=datetime.timedelta(seconds=60))
    return dist.PrefixStore("health_drill", client)


def _rank_drill(steps, every, slow_rank, slow_factor, hang_rank, hang_factor, batch_size=24) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    dataset = common.task()
    model, optimizer = common.build(0)
    times, named, gather_s, wall = stragglers.StepTimes(), [], [], []
    released, reports, timeout, slowest = threading.Event(), [], [0.0], [0.0]

    def on_hang(report):                     # production: print it, then os._exit(1)
        reports.append(report)
        released.set()                       # the drill: let the simulated hang end

    with Watchdog(_store(), rank, world, None, on_hang) as dog:
        for step in range(steps + 1):        # the last step is the hang drill's
            w0, c0 = time.perf_counter(), time.thread_time()
            dog.at(step, "data")
            if step == steps:
                dog.arm(timeout[0])          # armed where it is meant to fire
                if rank == hang_rank:
                    released.wait(timeout=120)   # the hang (a stuck read, a deadlocked loader)
            x, y = common.part_batch(dataset, step, batch_size, world, rank)
            dog.at(step, "forward_backward")
            for _ in range(slow_factor if rank == slow_rank and step < steps else 1):
                optimizer.zero_grad()        # the straggler computes the same step slow_factor times
                workload.loss_fn(model, x, y).backward()
            times.add(time.thread_time() - c0)
            dog.at(step, "all_reduce")
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world
            optimizer.step()
            wall.append(time.perf_counter() - w0)
            if (step + 1) % every == 0 and step < steps:
                g0 = time.perf_counter()
                medians = stragglers.gather_medians(times)
                gather_s.append(time.perf_counter() - g0)
                named.append({"step": step, "medians": medians, "slow": stragglers.name_stragglers(medians)})
            if step == steps - 1:            # the hang timeout, from this run's step times
                slowest[0] = max(common.gather_floats(statistics.median(wall)))
                timeout[0] = max(MIN_HANG_TIMEOUT_S, hang_factor * slowest[0])
        dog.at(steps, "done")
    return {"named": named, "gather_seconds": sorted(gather_s)[len(gather_s) // 2] if gather_s else 0.0,
            "report": reports[0] if reports else None, "hang_timeout_s": timeout[0],
            "slowest_median_step_s": slowest[0]}


def drill(world_size=3, steps=8, every=4, slow_rank=2, slow_factor=4, hang_rank=1, hang_factor=20.0,
          stream=None) -> dict:
    if not (0 <= slow_rank < world_size and 0 <= hang_rank < world_size):
        raise ValueError("slow_rank and hang_rank must be ranks of the world")
    if world_size < 2 or every > steps or slow_factor < 2:
        raise ValueError("needs world_size >= 2, every <= steps and slow_factor >= 2")
    out = processes.spawn(_rank_drill, world_size, steps, every, slow_rank, slow_factor, hang_rank,
                          hang_factor, device="cpu", stream=stream)
    # the hung rank's own watchdog report: taken while it still hangs (the others wait in the
    # all-reduce for it), before the drill releases it
    report, timeout = out[hang_rank]["report"], out[hang_rank]["hang_timeout_s"]
    return {"named": out[0]["named"], "gather_seconds": out[0]["gather_seconds"], "report": report,
            "hang_named": stuck_outside(report or {}, timeout), "hang_timeout_s": timeout,
            "slowest_median_step_s": out[0]["slowest_median_step_s"], "slow_rank": slow_rank, "hang_rank": hang_rank,
            "slow_factor": slow_factor, "hang_factor": hang_factor}


def main(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--world-size", type=positive_int, default=3)
    p.add_argument("--steps", type=positive_int, default=8)
    p.add_argument("--every", type=positive_int, default=4)
    p.add_argument("--slow-rank", type=nonnegative_int, default=2)
    p.add_argument("--slow-factor", type=positive_int, default=4, help="the slow rank computes this many times slower")
    p.add_argument("--hang-rank", type=nonnegative_int, default=1)
    p.add_argument("--hang-factor", type=positive_float, default=20.0,
                   help="hang timeout in median step times of this run")
    a = p.parse_args(argv)
    if a.world_size < 2 or a.slow_rank >= a.world_size or a.hang_rank >= a.world_size:
        raise LaunchError("error: --world-size must be >= 2 and --slow-rank/--hang-rank below it")
    if a.every > a.steps:
        raise LaunchError("error: --every must be <= --steps (the gather happens every K steps)")
    if a.slow_factor < 2:
        raise LaunchError("error: --slow-factor must be >= 2 (1 is not slower)")
    r = drill(a.world_size, a.steps, a.every, a.slow_rank, a.slow_factor, a.hang_rank, a.hang_factor)
    where = " ".join(f"rank{k}={v['phase']}@{v['step']}" for k, v in (r["report"] or {}).items())
    print(f"summary: straggler_named={r['named'][-1]['slow']} gather_ms={1e3 * r['gather_seconds']:.2f} "
          f"hang_timeout_s={r['hang_timeout_s']:.2f} hang_named={r['hang_named']} {where}")
    return 0


if __name__ == "__main__":
    run_main(main)
