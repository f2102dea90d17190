"""The pipeline bubble measured against (p - 1) / (m + p - 1).

    torchrun --standalone --nproc-per-node=2 -m source_code.pipeline.bubble
    torchrun --standalone --nproc-per-node=4 -m source_code.pipeline.bubble   # oversubscribed on 2 cores
    torchrun --standalone --nproc-per-node=2 -m source_code.pipeline.bubble --out bubble.json

p = the number of processes, one stage each. The model is an MLP stack with the same work on
every stage (the formula assumes equal stages) and a fixed microbatch size, so an operation
costs the same for every m: tens of milliseconds. On CPU a message costs CPU time on both
sides (the CPU is the interconnect), so the work of an operation grows with depth (64 layers
per stage at p = 2) while a message (256 rows x 256 = 256 KB) stays small. Narrow layers keep
a layer's working set within a core's L2 cache: two stages computing at once then do not slow
each other down (width 1024 layers did, by ~15 %, so a stage's speed depended on the other's). For each m, GPipe and 1F1B run
--steps steps interleaved; every stage records the start and end of each forward and backward
on one clock (perf_counter), and

    bubble = idle time / (p x step time)

where the step runs from the first operation's start to the last one's end, over all
stages, and a stage is busy only while it computes (waiting for a message is idle). Each
step gives one value; the table shows the median over the steps. Last line:

    bubble_max_rel_error=E     (largest |measured - theory| / theory over m and schedules)

With more processes than cores (p = 4 on 2 cores) stages take turns on a core: the numbers
are noisier and larger than the formula.
"""
from __future__ import annotations

import json
import statistics

import torch

from source_code.cli import Parser, positive_int, writable_path
from source_code.distributed import LaunchError, print0, ranks_from_env, run_main, session
from source_code.pipeline import harness, simulator
from source_code.pipeline.formulas import bubble_theory, relative_error

LAUNCH = "torchrun --standalone --nproc-per-node=2 -m source_code.pipeline.bubble"
SCHEDULES = ("gpipe", "1f1b")


def measure(ms, steps: int, work: harness.Workload, warmup: int = 1) -> dict:
    """On every rank: {schedule: {m: {"bubbles": [...], "step_s": [...], "timeline": records}}}."""
    out = {name: {} for name in SCHEDULES}
    for m in ms:
        res = harness.timed_steps(SCHEDULES, m, steps, work, warmup=warmup)
        for name in SCHEDULES:
            steps_records = [harness.gather_records(r) for r in res[name]["records"]]
            bubbles = [simulator.bubble_fraction(r) for r in steps_records]
            median_step = sorted(range(len(bubbles)), key=bubbles.__getitem__)[len(bubbles) // 2]
            out[name][m] = {"bubbles": bubbles, "step_s": res[name]["step_s"],
                            "timeline": steps_records[median_step]}
    return out


def table(result: dict, p: int) -> tuple[list[str], float]:
    lines = [f"{'schedule':<9}{'m':>3}{'theory':>9}{'measured':>10}{'rel.err':>9}{'step ms':>9}"]
    worst = 0.0
    for name, per_m in result.items():
        for m, r in per_m.items():
            theory, meas = bubble_theory(p, m), statistics.median(r["bubbles"])
            err = relative_error(meas, theory)
            worst = max(worst, err)
            lines.append(f"{name:<9}{m:>3}{theory:>9.3f}{meas:>10.3f}{err:>9.3f}"
                         f"{1e3 * statistics.median(r['step_s']):>9.1f}")
    return lines, worst


def main(argv=None):
    ap = Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--microbatches", default="1,2,4,8", help="comma-separated values of m")
    ap.add_argument("--steps", type=positive_int, default=3, help="measured steps per schedule and m")
    ap.add_argument("--width", type=positive_int, default=256, help="MLP width (work per layer ~ width^2)")
    ap.add_argument("--layers", type=positive_int, default=128, help="MLP layers in total (divided among the stages)")
    ap.add_argument("--rows", type=positive_int, default=256, help="rows per microbatch")
    ap.add_argument("--out", type=writable_path, default="", help="write every measurement as JSON here (rank 0)")
    args = ap.parse_args(argv)
    try:
        ms = [int(v) for v in args.microbatches.split(",")]
    except ValueError:
        raise LaunchError(f"error: --microbatches {args.microbatches!r} is not a list of integers; "
                          "use e.g. --microbatches 1,2,4,8") from None
    if min(ms) < 1:
        raise LaunchError(f"error: --microbatches {args.microbatches}: every m must be >= 1")
    found = ranks_from_env()
    world = found[2] if found else 1
    if args.layers < world:
        raise LaunchError(f"error: --layers {args.layers} cannot fill {world} stages; use "
                          f"--layers {world} or more (one layer per stage at least)")
    torch.set_num_threads(1)  # one core per stage: the processes are the parallelism
    work = harness.Workload(kind="mlp", layers=args.layers, dim=args.width, microbatch=args.rows)
    with session(launch_hint=LAUNCH, seed=0) as ctx:
        if ctx.world_size < 2:
            raise LaunchError(f"error: a pipeline needs at least 2 processes; run: {LAUNCH}")
        result = measure(ms, args.steps, work)
        lines, worst = table(result, ctx.world_size)
        print0(f"bubble: p={ctx.world_size} stages, MLP width {args.width}, {args.layers} layers, "
               f"{args.rows} rows per microbatch, median of {args.steps} steps")
        print0("\n".join(lines))
        if args.out and ctx.is_main:
            with open(args.out, "w") as f:
                json.dump({"p": ctx.world_size, "result": result}, f)
        print0(f"bubble_max_rel_error={worst:.4f}")
    return 0


if __name__ == "__main__":
    run_main(main)
