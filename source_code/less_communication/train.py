"""Every method of notebook 18 in one run, and the line that sums it up.

    torchrun --standalone --nproc-per-node=2 -m source_code.less_communication.train
    torchrun --standalone --nproc-per-node=2 -m source_code.less_communication.train --goals-only
    torchrun --standalone --nproc-per-node=2 -m source_code.less_communication.train --steps 320 --seeds 0,1,2,3 --out runs.json

Trains the same TransformerLM on the same batches of --task (tasks.py: ``sort``, the generated
sort task, or ``markov``, sequences of a fixed random Markov chain whose loss has a floor above
0) from one start pretrained --pretrain steps with DDP, then --steps more with each method
(experiment.py): plain DDP, DDP with the fp16 hook and PowerSGD (by hand at ranks 1, --rank,
4 and 8 with error feedback, at 8 also without, and torch's hook for its first steps), local SGD,
DiLoCo (the outer step as ours and as the paper sets it) at H = --every and
at the --sweep values, and streaming DiLoCo (fragments consecutive or strided, fp32, fp16 or
4-bit outer gradients); the spread runs again for every seed of --seeds; and the checks that
put a slow link on this machine. ``--goals-only`` trains only what the summary line needs (the
same runs, so the same numbers). Prints a line per run as it ends, a line per method (held-out
loss, bytes per step relative to DDP's, time on --link from the link model), and a last line

    summary: ... powersgd_bytes_ratio=P powersgd_loss_gap=L diloco_bytes_ratio=D diloco_loss_gap=G diloco_excess_gap=E

P: PowerSGD's bytes per step at --rank over DDP's (the same hook-free all-reduce); L: what P
costs, (PowerSGD's held-out loss at --rank - DDP with SGD's) / DDP with SGD's (the same
optimizer, seed and batches; at the default rank 2, which meets P, well above 0); D: DiLoCo's
at --every over DDP's; G: (DiLoCo's held-out loss - DDP's) / DDP's; E: the same gap in loss
above the task's floor, (L_DiLoCo - L_DDP) / (L_DDP - floor) (on ``sort`` the floor is 0 and E
is G). Losses are held-out losses of synchronised models after the same steps and tokens. The
goals: P <= 0.1, D <= 0.05, E <= 0.1.
"""
from __future__ import annotations

import json
import math
import time

import torch

from source_code.cli import Parser, nonnegative_int, positive_float, positive_int, writable_path
from source_code.distributed import LaunchError, print0, ranks_from_env, run_main, session
from source_code.less_communication import experiment, links, tasks
from source_code.less_communication.harness import DEFAULTS, replay_time, settings_with

LAUNCH = "torchrun --standalone --nproc-per-node=2 -m source_code.less_communication.train"
GOALS = {"powersgd_bytes_ratio": 0.1, "diloco_bytes_ratio": 0.05, "diloco_excess_gap": 0.1}


def int_list(flag: str, text: str) -> tuple:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise LaunchError(f"error: {flag} takes integers separated by commas (e.g. 10,40), got {text!r}") from None
    if not values or min(values) < (1 if flag == "--sweep" else 0):
        raise LaunchError(f"error: {flag} needs values >= {1 if flag == '--sweep' else 0}, got {text!r}")
    return values


def parse_args(argv=None):
    d = DEFAULTS
    p = Parser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=positive_int, default=d["steps"], help="steps of each method after the start")
    p.add_argument("--pretrain", type=nonnegative_int, default=d["pretrain"], help="DDP steps of the common start")
    p.add_argument("--batch", type=positive_int, default=d["batch"], help="global batch (sequences)")
    p.add_argument("--lr", type=positive_float, default=d["lr"], help="AdamW (DDP, inner steps)")
    p.add_argument("--sgd-lr", type=positive_float, default=d["sgd_lr"], help="SGD with Nesterov momentum (hooks)")
    p.add_argument("--dim", type=positive_int, default=d["dim"])
    p.add_argument("--layers", type=positive_int, default=d["layers"])
    p.add_argument("--rank", type=positive_int, default=d["rank"], help="PowerSGD's rank r")
    p.add_argument("--every", type=positive_int, default=d["every"], help="DiLoCo's H")
    p.add_argument("--sweep", type=str, default=",".join(map(str, d["sweep"])), help="other H values")
    p.add_argument("--fragments", type=positive_int, default=d["fragments"])
    p.add_argument("--delay", type=int, default=d["delay"], help="streaming DiLoCo's tau (steps in flight)")
    p.add_argument("--goals-only", action="store_true", help="train only what the summary line needs")
    p.add_argument("--link", default=d["link"], help=f"one of {', '.join(links.LINKS)}")
    p.add_argument("--task", default=d["task"], help=f"one of {', '.join(tasks.TASKS)} (tasks.py)")
    p.add_argument("--seed", type=int, default=d["seed"], help="the main seed")
    p.add_argument("--seeds", type=str, default=",".join(map(str, d["seeds"])), help="seeds of the spread runs")
    p.add_argument("--out", type=writable_path, default="", help="results as JSON")
    return p.parse_args(argv)


def check(args, env=None) -> dict:
    """Every flag against the launch, before the process group: the settings or a LaunchError."""
    found = ranks_from_env(env)
    world = found[2] if found else 1
    if world < 2:
        raise LaunchError(f"error: these methods need at least 2 processes; launch with {LAUNCH}")
    if args.link not in links.LINKS:
        raise LaunchError(f"error: --link {args.link!r} is unknown; choose one of {', '.join(links.LINKS)}")
    if args.task not in tasks.TASKS:
        raise LaunchError(f"error: --task {args.task!r} is unknown; choose one of {', '.join(tasks.TASKS)}")
    sweep, seeds = int_list("--sweep", args.sweep), int_list("--seeds", args.seeds)
    for h in (args.every, *sweep):
        if args.steps % h:
            raise LaunchError(f"error: --steps {args.steps} is not a multiple of H={h} (--every/--sweep); "
                              f"use a multiple of {math.lcm(args.every, *sweep)}")
    if args.every % args.fragments:
        raise LaunchError(f"error: --every {args.every} does not split into --fragments {args.fragments}; "
                          "use a divisor of --every")
    if not 0 <= args.delay < args.every:
        raise LaunchError(f"error: --delay {args.delay} must be in [0, --every {args.every}): "
                          "a fragment's next synchronisation starts H steps later")
    if args.steps <= 2:
        raise LaunchError("error: --steps must be above 2: PowerSGD's first 2 steps are plain all-reduces")
    if args.batch % world:
        raise LaunchError(f"error: --batch {args.batch} does not divide among {world} ranks; "
                          f"use a multiple of {world}")
    if args.dim % 4:
        raise LaunchError(f"error: --dim {args.dim} must be a multiple of the 4 attention heads")
    if not all(0 <= k < 2**31 for k in (args.seed, *seeds)):
        raise LaunchError("error: --seed and --seeds must be in [0, 2**31)")
    return settings_with(steps=args.steps, pretrain=args.pretrain, batch=args.batch, lr=args.lr,
                         sgd_lr=args.sgd_lr, dim=args.dim, layers=args.layers, rank=args.rank,
                         every=args.every, sweep=sweep, fragments=args.fragments, link=args.link,
                         seed=args.seed, seeds=seeds, delay=args.delay, goals_only=args.goals_only,
                         task=args.task)


def ratios(results: dict) -> dict:
    """P, L, D, G and E of the summary line (see the module docstring)."""
    s, runs = results["settings"], results["runs"]
    ddp, diloco = runs["ddp"]["eval"], runs[f"diloco-{s['every']}"]["eval"]
    powersgd, ddp_sgd = runs[f"powersgd-r{s['rank']}"], runs["ddp-sgd"]
    return {"powersgd_bytes_ratio": powersgd["bytes_per_step"] / ddp_sgd["bytes_per_step"],
            "powersgd_loss_gap": (powersgd["eval"] - ddp_sgd["eval"]) / ddp_sgd["eval"],
            "diloco_bytes_ratio": runs[f"diloco-{s['every']}"]["bytes_per_step"] / runs["ddp"]["bytes_per_step"],
            "diloco_loss_gap": (diloco - ddp) / ddp,
            "diloco_excess_gap": tasks.excess_gap(diloco, ddp, results["floor"]["held_out"])}


def summary_line(results: dict, seconds: float | None = None) -> str:
    s, r = results["settings"], ratios(results)
    took = f" seconds={seconds:.1f}" if seconds is not None else ""
    return (f"summary: world_size={results['runs']['ddp']['world']} methods={len(results['runs'])} "
            f"steps={s['steps']} pretrain={s['pretrain']} rank={s['rank']} every={s['every']} task={s['task']}"
            f"{took} " + " ".join(f"{k}={v:.4f}" for k, v in r.items()))


def main(argv=None):
    args = parse_args(argv)
    settings = check(args)
    torch.set_num_threads(1)
    start = time.perf_counter()
    with session(launch_hint=LAUNCH, seed=args.seed) as ctx:
        print0(f"{ctx.world_size} processes, {ctx.backend} on {ctx.device.type}")
        results = experiment.experiment(settings)
    if results is None:
        return 0
    ref = results["runs"]["ddp"]["bytes_per_step"]          # ddp-sgd's are the same
    for method, run in results["runs"].items():
        on_link = (f"{replay_time(run, settings['link'])[-1]:7.2f} s on the {settings['link']} link"
                   if run["ops"] is not None else f"(torch's own count, {len(run['loss'])} steps; not replayed)")
        print(f"{method:30s} held-out loss {run['eval']:.4f}  bytes/step {run['bytes_per_step']:9.0f} "
              f"({run['bytes_per_step'] / ref:.3f} of DDP's)  {on_link}", flush=True)
    fl = results["floor"]
    print(f"floor of the {fl['task']} task: {fl['held_out']:.4f} on the held-out set "
          f"({fl['expected']:.4f} expected)", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f)
    print(summary_line(results, time.perf_counter() - start), flush=True)
    return 0


if __name__ == "__main__":
    run_main(main)
