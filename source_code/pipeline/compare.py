"""Own GPipe / 1F1B vs torch.distributed.pipelining's schedules: step times side by side, one run.

    torchrun --standalone --nproc-per-node=2 -m source_code.pipeline.compare
    torchrun --standalone --nproc-per-node=4 -m source_code.pipeline.compare --layers 8 --microbatches 8
    torchrun --standalone --nproc-per-node=2 -m source_code.pipeline.compare --out compare.json

The same TransformerLM (same seed) is cut into stages for every schedule; the schedules take
turns step by step (a noisy neighbour slows all alike), with an SGD update after each step.
Printed: one line per schedule, ``compare: schedule=NAME median_ms=T ratio=R`` (R: relative to
own GPipe), and first a parity line per schedule: its loss and gradients against the unsplit
model on the whole batch (``max_grad_diff``), which must stay below --tol (by default 1e-5
on the CPU, more on a GPU: ``source_code.parity.tolerance``, printed first).
Multi-stage library schedules hold two stages per process: --layers >= 2 x processes.
"""
from __future__ import annotations

import json
import statistics

import torch
import torch.distributed as dist

from source_code.cli import Parser, nonnegative_int, positive_float, positive_int, writable_path
from source_code.distributed import LaunchError, print0, ranks_from_env, run_main, session
from source_code.parity import tolerance
from source_code.pipeline import harness, library

LAUNCH = "torchrun --standalone --nproc-per-node=2 -m source_code.pipeline.compare"


def paired_ratios(step_s: dict, base: str) -> dict:
    """Every other schedule's step over ``base``'s step of the same round, round by round (the
    schedules take turns step by step, so a busy neighbour slows both of a pair alike):
    {name: [ratio of round 0, round 1, ...]}."""
    return {name: [t / t_base for t, t_base in zip(ts, step_s[base], strict=True)]
            for name, ts in step_s.items() if name != base}


def run(ctx, args) -> dict:
    work = harness.Workload(layers=args.layers, dim=args.dim, microbatch=args.rows)
    names = ["gpipe", "1f1b"] + [n for n in library.available(ctx.device)
                                 if args.layers >= library.n_stages(n, ctx.world_size)]
    for name in sorted(set(library.provided()) - set(library.available(ctx.device))):
        print0(f"note: {name} left out: {library.refusal(name, ctx.device).removeprefix('error: ')}")
    diffs = {}
    for name in names:
        res = harness.parity(name, args.microbatches, work)
        t = torch.tensor([res["grad_diff"], res["loss_diff"] or 0.0], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        diffs[name] = t.tolist()
    times = harness.timed_steps(names, args.microbatches, args.steps, work, warmup=args.warmup)
    step_s = {n: times[n]["step_s"] for n in names}
    return {"diffs": diffs, "step_s": step_s, "world_size": ctx.world_size,
            "microbatches": args.microbatches}


def main(argv=None):
    ap = Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--microbatches", type=positive_int, default=4)
    ap.add_argument("--rows", type=positive_int, default=8, help="examples per microbatch")
    ap.add_argument("--layers", type=positive_int, default=4)
    ap.add_argument("--dim", type=positive_int, default=128)
    ap.add_argument("--steps", type=positive_int, default=8, help="measured steps per schedule")
    ap.add_argument("--warmup", type=nonnegative_int, default=2)
    ap.add_argument("--tol", type=positive_float, default=None,
                    help="largest accepted difference (default: 1e-5 on the CPU, more on a GPU)")
    ap.add_argument("--out", type=writable_path, default="", help="write the step times as JSON (rank 0)")
    args = ap.parse_args(argv)
    found = ranks_from_env()
    world = found[2] if found else 1
    if args.layers < world:
        raise LaunchError(f"error: --layers {args.layers} cannot fill {world} stages; use --layers {world} or more")
    if args.dim % 4:
        raise LaunchError(f"error: --dim {args.dim} must be a multiple of the 4 attention heads")
    torch.set_num_threads(1)
    with session(launch_hint=LAUNCH, seed=0) as ctx:
        if ctx.world_size < 2:
            raise LaunchError(f"error: a pipeline needs at least 2 processes; run: {LAUNCH}")
        tol, why = (args.tol, f"tolerance {args.tol:g} (--tol)") if args.tol else tolerance(ctx.device, 1e-5)
        print0(why)
        res = run(ctx, args)
        res["tol"] = tol
        for name, (g, l) in res["diffs"].items():
            print0(f"parity: schedule={name} max_grad_diff={g:.2e} loss_diff={l:.2e}")
        base = statistics.median(res["step_s"]["gpipe"])
        for name, ts in res["step_s"].items():
            med = statistics.median(ts)
            print0(f"compare: schedule={name} median_ms={1e3 * med:.1f} ratio={med / base:.2f}")
        if args.out and ctx.is_main:
            with open(args.out, "w") as f:
                json.dump(res, f)
        worst = max(max(v) for v in res["diffs"].values())
    if worst > tol:
        raise SystemExit(f"error: a schedule differs from the unsplit model by {worst:.2e} > tolerance {tol:g}")
    return 0


if __name__ == "__main__":
    run_main(main)
