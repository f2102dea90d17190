"""The pipeline bubble measured against (p - 1) / (m + p - 1): raw, held, and with a slow stage.

    torchrun --standalone --nproc-per-node=2 -m source_code.pipeline.bubble
    torchrun --standalone --nproc-per-node=4 -m source_code.pipeline.bubble   # oversubscribed on 2 cores
    torchrun --standalone --nproc-per-node=2 -m source_code.pipeline.bubble --runs raw   # ops as computed
    torchrun --standalone --nproc-per-node=2 -m source_code.pipeline.bubble --hold 0     # the same
    torchrun --standalone --nproc-per-node=2 -m source_code.pipeline.bubble --out bubble.json

p = the number of processes, one stage each. The model is an MLP stack with the same work on
every stage and a fixed microbatch size (256 rows x width 256: a 256 KB message), so an
operation costs the same for every m. For each m, GPipe and 1F1B run --steps steps
interleaved after a warm-up step; every stage records the start and end of each forward and
backward on one clock (perf_counter; on a GPU read after synchronising, ``measure.clock``,
so that a message still in flight counts as idle), and

    bubble = idle time / (p x step time)

where the step runs from the first operation's start to the last one's end, over all
stages; an operation is busy from its start to its end (with a hold: until the hold is over),
waiting for a message is idle. Each step gives one value; the table shows the median over the
steps. Three runs (--runs), taking turns at each m in one launch:

* ``raw``: every operation as computed;
* ``held``: every F and B held to a fixed duration (``--hold``: 1.25 x the slowest stage's
  median in a calibration step, GPipe at the largest m, where operations are slowest): the
  stage computes, then holds until the time is up, like a device of fixed speed
  (``schedules.run_step``'s ``hold``). The hold counts as busy: the controlled experiment;
* ``slow``: held, but stage --slow-stage holds --slow-factor x as long, and at least that many
  times its own computation (a slower device, or a stage with more layers, stays that much slower
  on a busy machine): the formula assumes equal stages and does not predict this one.

Last lines, then: ``bubble_max_rel_error_RUN=E`` per run and ``bubble_max_rel_error=E`` (of
the held run; of the first run without it), E the largest |measured - theory| / theory over m
and schedules. With --out every measurement goes to a JSON file.

At m = 8 the formula says 0.111, so E <= 0.10 leaves 0.011: about 10 ms of a 900 ms step
(256 layers). What used up that margin on 2 CPU cores (measured with per-operation timelines):

* unequal stages: the formula assumes every stage takes the same time. Two identical
  processes on the two cores differ by 0.3-6 % from second to second, and a stage 2 % slower
  over a step makes the other wait for it: + 0.01 at m = 8 (E = 0.1) on its own. The held run
  removes this; the raw run keeps it;
* page faults: glibc gives the heap back to the OS when a step frees its activations, and
  GPipe's m-th forward pays for its memory again (F7: 40-45 ms instead of 34 at m = 8 with
  128 layers): ``keep_freed_memory``;
* what the formula leaves out: a message takes ~0.4 ms from one stage's end to the next
  one's start, and a stage spends ~0.3 ms between two operations posting its messages.
  Column ``sim`` is the simulator's bubble with these measured costs and each stage's own
  median F and B; it stays above the formula by 0.003 at m = 8 with 256 layers (0.006 with
  128: shorter operations dilute it less). In the --out file, ``replay`` gives every measured
  step replayed by the simulator with that step's own durations (``bubble.replay``), and what
  operations running past their hold added to it: a busy machine's share, counted.

With 256 layers the raw run gave E = 0.14 (stages 1-2 % apart at m = 8), the held one 0.03-0.04.
With more processes than cores (p = 4 on 2 cores) stages take turns on a core: the numbers
are noisier and larger than the formula (E = 0.08 and 0.04 in two runs; the holds sleep, so
two stages share a core, but dozens of operations run past their hold).
"""
from __future__ import annotations

import ctypes
import json
import statistics

import torch
import torch.distributed as dist

from source_code.cli import Parser, positive_int, writable_path
from source_code.distributed import LaunchError, print0, ranks_from_env, run_main, session
from source_code.pipeline import harness, simulator
from source_code.pipeline.formulas import bubble_theory, relative_error

LAUNCH = "torchrun --standalone --nproc-per-node=2 -m source_code.pipeline.bubble"
SCHEDULES = ("gpipe", "1f1b")


def keep_freed_memory() -> bool:
    """Ask glibc to keep freed memory instead of giving it back to the OS (Linux; else no-op).

    By default the heap is trimmed when a step frees its activations, and the next step's
    peak (GPipe: m microbatches stored) is paid again in page faults: F7 took 40-45 ms instead
    of 34 at m = 8 with 128 layers. Returns whether the setting took."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3          # glibc's mallopt parameter numbers
    return bool(libc.mallopt(m_trim_threshold, 1 << 30)) and bool(libc.mallopt(m_mmap_threshold, 1 << 25))


def calibrate(work: harness.Workload, margin: float, device, m: int) -> dict | None:
    """The fixed durations {"F": s, "B": s}: ``margin`` x the slowest stage's median forward
    (backward) in a GPipe step with the largest m after a warm-up step (the most stored
    activations: operations are slowest there). None if margin is 0."""
    if margin == 0:
        return None
    res = harness.timed_steps(("gpipe",), m, 1, work, warmup=1)
    mine = [r for rec in res["gpipe"]["records"] for r in rec]
    med = torch.tensor([statistics.median(r["end"] - r["start"] for r in mine if r["kind"] == k)
                        for k in "FB"], dtype=torch.float64, device=device)
    dist.all_reduce(med, op=dist.ReduceOp.MAX)
    return {"F": margin * float(med[0]), "B": margin * float(med[1])}


def overheads(timelines) -> tuple[float, float]:
    """Medians over the measured steps: (message: producer's end -> consumer's start when the
    consumer was waiting for it, gap: a stage's idle time between two operations otherwise)."""
    msg, gap = [], []
    for tl in timelines:
        p = 1 + max(r["stage"] for r in tl)
        end = {(r["kind"], r["stage"], r["mb"]): r["end"] for r in tl}
        for s in range(p):
            ops = sorted((r for r in tl if r["stage"] == s), key=lambda r: r["start"])
            for k, r in enumerate(ops):
                src = (r["stage"] - 1 if r["kind"] == "F" else r["stage"] + 1)
                dep = end.get((r["kind"], src, r["mb"])) if 0 <= src < p else None
                prev = ops[k - 1]["end"] if k else None
                if dep is not None and (prev is None or dep > prev):
                    msg.append(r["start"] - dep)
                elif prev is not None:
                    gap.append(r["start"] - prev)
    return statistics.median(msg), statistics.median(gap)


def predicted(name: str, p: int, m: int, fwd, bwd, comm: float, gap: float) -> float:
    """The simulator's bubble with these costs (fwd, bwd: one per stage), messages and gaps."""
    return simulator.bubble_fraction(simulator.simulate(simulator.orders(name, p, m), fwd, bwd, comm, gap))


RUNS = ("raw", "held", "slow")


def run_holds(runs, hold: dict | None, p: int, slow_stage: int, slow_factor: float) -> dict:
    """{run: [stage s's hold {"F": s, "B": s} or None, for s in range(p)]}."""
    out = {}
    for run in runs:
        if run == "raw":
            out[run] = [None] * p
        else:
            f = [slow_factor if run == "slow" and s == slow_stage else 1.0 for s in range(p)]
            out[run] = [{k: f[s] * v for k, v in hold.items()} | ({"scale": f[s]} if f[s] != 1.0 else {})
                        for s in range(p)]
    return out


def measure(ms, steps: int, work: harness.Workload, holds: dict, rank: int, warmup: int = 1) -> dict:
    """On every rank: {run: {schedule: {m: {"bubbles": [...], "step_s": [...], "timeline": records}}}};
    at each m the runs take turns (a noisy neighbour slows them alike)."""
    out = {run: {name: {} for name in SCHEDULES} for run in holds}
    for m in ms:
        for run, per_stage in holds.items():
            res = harness.timed_steps(SCHEDULES, m, steps, work, warmup=warmup, hold=per_stage[rank])
            for name in SCHEDULES:
                steps_records = [harness.gather_records(r) for r in res[name]["records"]]
                bubbles = [simulator.bubble_fraction(r) for r in steps_records]
                median_step = sorted(range(len(bubbles)), key=bubbles.__getitem__)[len(bubbles) // 2]
                out[run][name][m] = {"bubbles": bubbles, "step_s": res[name]["step_s"],
                                     "timeline": steps_records[median_step], "all": steps_records}
    return out


def costs(result: dict, p: int, keep: bool = False) -> dict:
    """Per-stage median F and B, message time and gap over every measured step (for the simulator);
    the steps' records ("all") are dropped unless ``keep``."""
    tls = [tl for per_m in result.values() for r in per_m.values()
           for tl in (r["all"] if keep else r.pop("all"))]
    med = {k: [statistics.median(r["end"] - r["start"] for tl in tls for r in tl
                                 if r["stage"] == s and r["kind"] == k) for s in range(p)] for k in "FB"}
    comm, gap = overheads(tls)
    return {"F": med["F"], "B": med["B"], "comm": comm, "gap": gap}


def replay(result: dict, p: int, cost: dict, nominal: dict | None) -> dict:
    """Each measured step replayed by the simulator: {schedule: {m: {"replayed": [bubble per
    step], "overrun": [...]}}}. "replayed" feeds it that step's own durations, operation by
    operation, with that step's median message time and gap (the run's where a step has none):
    whatever the machine did to an operation (a busy core, a late page fault) is in its
    duration, and the idle time that follows from it is the model's. "overrun": the replayed
    bubble minus the same replay with every operation at its nominal duration (its hold; the
    stage's median without one): the idle time that operations running past their nominal
    duration added to that step."""
    out = {}
    for name, per_m in result.items():
        for m, r in per_m.items():
            order = simulator.orders(name, p, m)
            base = nominal or {"F": cost["F"], "B": cost["B"]}
            got, plain = [], []
            for tl in r["all"]:
                try:
                    comm, gap = overheads([tl])
                except statistics.StatisticsError:  # no message waited for, or no gap, in this step
                    comm, gap = cost["comm"], cost["gap"]
                durations = {(op["kind"], op["stage"], op["mb"]): op["end"] - op["start"] for op in tl}
                got.append(simulator.bubble_fraction(simulator.simulate(order, base["F"], base["B"], comm, gap,
                                                                        durations=durations)))
                plain.append(simulator.bubble_fraction(simulator.simulate(order, base["F"], base["B"], comm, gap)))
            out.setdefault(name, {})[m] = {"replayed": got, "overrun": [g - q for g, q in zip(got, plain)]}
    return out


def table(result: dict, p: int, cost: dict, run: str = "") -> tuple[list[str], float, dict]:
    """Rows (run, schedule, m, theory, measured, rel.err, sim, step ms), the largest relative
    error, and {schedule: {m: the simulator's bubble}}."""
    lines, worst, sims = [], 0.0, {}
    for name, per_m in result.items():
        for m, r in per_m.items():
            theory, meas = bubble_theory(p, m), statistics.median(r["bubbles"])
            err = relative_error(meas, theory)
            worst = max(worst, err)
            sim = sims.setdefault(name, {})[m] = predicted(name, p, m, cost["F"], cost["B"],
                                                           cost["comm"], cost["gap"])
            lines.append(f"{run:<6}{name:<9}{m:>3}{theory:>9.3f}{meas:>10.3f}{err:>9.3f}{sim:>8.3f}"
                         f"{1e3 * statistics.median(r['step_s']):>9.1f}")
    return lines, worst, sims


HEADER = f"{'run':<6}{'schedule':<9}{'m':>3}{'theory':>9}{'measured':>10}{'rel.err':>9}{'sim':>8}{'step ms':>9}"


def main(argv=None):
    ap = Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--microbatches", default="1,2,4,8", help="comma-separated values of m")
    ap.add_argument("--steps", type=positive_int, default=3, help="measured steps per schedule and m")
    ap.add_argument("--width", type=positive_int, default=256, help="MLP width (work per layer ~ width^2)")
    ap.add_argument("--layers", type=positive_int, default=128, help="MLP layers in total (divided among the stages)")
    ap.add_argument("--rows", type=positive_int, default=256, help="rows per microbatch")
    ap.add_argument("--runs", default="", help=f"comma-separated, of {', '.join(RUNS)} (default: all; "
                    "raw only with --hold 0)")
    ap.add_argument("--hold", type=float, default=1.25,
                    help="held runs: every F (B) lasts this x the slowest stage's median F (B); 0: raw run only")
    ap.add_argument("--slow-stage", type=int, default=1, help="the slow run's slow stage")
    ap.add_argument("--slow-factor", type=float, default=1.5, help="its operations last this x the hold")
    ap.add_argument("--out", type=writable_path, default="", help="write every measurement as JSON here (rank 0)")
    args = ap.parse_args(argv)
    try:
        ms = [int(v) for v in args.microbatches.split(",")]
    except ValueError:
        raise LaunchError(f"error: --microbatches {args.microbatches!r} is not a list of integers; "
                          "use e.g. --microbatches 1,2,4,8") from None
    if min(ms) < 1:
        raise LaunchError(f"error: --microbatches {args.microbatches}: every m must be >= 1")
    runs = [r for r in (args.runs or (",".join(RUNS) if args.hold else "raw")).split(",") if r]
    if not runs or set(runs) - set(RUNS) or len(set(runs)) != len(runs):
        raise LaunchError(f"error: --runs {args.runs!r}: give each of {', '.join(RUNS)} at most once, "
                          "e.g. --runs raw,held")
    if set(runs) - {"raw"} and not args.hold >= 1:
        raise LaunchError(f"error: --hold {args.hold}: the runs {args.runs or 'held, slow'} need a factor "
                          ">= 1, e.g. --hold 1.25 (--runs raw or --hold 0 measure without a hold)")
    if not args.slow_factor > 0:
        raise LaunchError(f"error: --slow-factor {args.slow_factor} must be > 0, e.g. 1.5")
    found = ranks_from_env()
    world = found[2] if found else 1
    if args.layers < world:
        raise LaunchError(f"error: --layers {args.layers} cannot fill {world} stages; use "
                          f"--layers {world} or more (one layer per stage at least)")
    if "slow" in runs and not 0 <= args.slow_stage < world:
        raise LaunchError(f"error: --slow-stage {args.slow_stage}: the stages are 0..{world - 1}")
    torch.set_num_threads(1)  # one core per stage: the processes are the parallelism
    kept = keep_freed_memory()
    work = harness.Workload(kind="mlp", layers=args.layers, dim=args.width, microbatch=args.rows)
    with session(launch_hint=LAUNCH, seed=0) as ctx:
        if ctx.world_size < 2:
            raise LaunchError(f"error: a pipeline needs at least 2 processes; run: {LAUNCH}")
        p = ctx.world_size
        hold = calibrate(work, args.hold, ctx.device, max(ms)) if set(runs) - {"raw"} else None
        holds = run_holds(runs, hold, p, args.slow_stage, args.slow_factor)
        result = measure(ms, args.steps, work, holds, ctx.rank)
        print0(f"bubble: p={p} stages, MLP width {args.width}, {args.layers} layers, "
               f"{args.rows} rows per microbatch, median of {args.steps} steps; runs: {', '.join(runs)}"
               f"{'' if kept else ' (freed memory returned to the OS: glibc not found)'}")
        if hold:
            print0(f"hold: every F lasts {1e3 * hold['F']:.1f} ms, every B {1e3 * hold['B']:.1f} ms "
                   f"({args.hold} x the slowest stage's median); the hold counts as busy")
        if "slow" in runs:
            print0(f"slow: stage {args.slow_stage} holds {args.slow_factor} x as long "
                   f"(F {1e3 * holds['slow'][args.slow_stage]['F']:.1f} ms, "
                   f"B {1e3 * holds['slow'][args.slow_stage]['B']:.1f} ms)")
        report = {"p": p, "hold": hold, "hold_factor": args.hold,
                  "slow": {"stage": args.slow_stage, "factor": args.slow_factor}, "runs": {}}
        lines = [HEADER]
        for run in runs:
            per = holds[run]
            nominal = None if per[0] is None else {k: [h[k] for h in per] for k in "FB"}
            cost = costs(result[run], p, keep=True)
            replays = replay(result[run], p, cost, nominal)
            for per_m in result[run].values():
                for v in per_m.values():
                    v.pop("all")
            rows, worst, sims = table(result[run], p, cost, run)
            lines += rows
            over = 0 if per[0] is None else sum(
                r["end"] - r["start"] > per[r["stage"]][r["kind"]] + 1e-3
                for per_m in result[run].values() for v in per_m.values() for r in v["timeline"])
            report["runs"][run] = {"holds": holds[run], "result": result[run], "cost": cost,
                                   "sim": sims, "replay": replays, "max_rel_error": worst, "past_hold": over}
        print0("\n".join(lines))
        for run, r in report["runs"].items():
            c = r["cost"]
            print0(f"sim ({run}): the simulator with per-stage F {_ms(c['F'])} ms, B {_ms(c['B'])} ms, a "
                   f"message {1e3 * c['comm']:.2f} ms, {1e3 * c['gap']:.2f} ms between a stage's operations"
                   + (f"; median-step operations past their hold by > 1 ms: {r['past_hold']}"
                      if r["holds"][0] else ""))
        if args.out and ctx.is_main:
            with open(args.out, "w") as f:
                json.dump(report, f)
        for run, r in report["runs"].items():
            print0(f"bubble_max_rel_error_{run}={r['max_rel_error']:.4f}")
        main_run = "held" if "held" in runs else runs[0]
        print0(f"bubble_max_rel_error={report['runs'][main_run]['max_rel_error']:.4f}")
    return 0


def _ms(values) -> str:
    return "/".join(f"{1e3 * v:.1f}" for v in values)


if __name__ == "__main__":
    run_main(main)
