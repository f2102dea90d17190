"""Every method of notebook 18 in one run, and the line that sums it up.

    torchrun --standalone --nproc-per-node=2 -m source_code.less_communication.train
    torchrun --standalone --nproc-per-node=2 -m source_code.less_communication.train --steps 240 --every 20 --rank 4 --out runs.json
    torchrun --standalone --nproc-per-node=2 -m source_code.less_communication.train --goals-only --task markov --dim 64 --rank 2 --steps 120

Trains the same TransformerLM on the same batches of --task (tasks.py: ``sort``, the generated
sort task, or ``markov``, sequences of a fixed random Markov chain, whose loss has a floor
above 0 as language modelling's has) with plain DDP, DDP with fp16 and PowerSGD hooks (by
hand, with and without error feedback, and torch's), local SGD, DiLoCo at H and at the
--sweep values, and streaming DiLoCo (harness.py), counting every collective, and streaming
DiLoCo with its all-reduces in flight for --delay steps on --link; on ``sort`` also DDP and
DiLoCo at H on ``markov``. ``--goals-only`` trains only DDP, DDP with SGD, PowerSGD and
DiLoCo at H (what P, D and G need). Prints a line per method (held-out loss, bytes per step
relative to DDP, time on --link from the link model), the task's floor with DiLoCo's gap
both ways (relative, and in excess loss over the floor), and a last line

    summary: ... powersgd_bytes_ratio=P diloco_bytes_ratio=D diloco_loss_gap=G

P: PowerSGD's bytes per step at --rank over DDP's with the same optimizer; D: DiLoCo's at
--every over DDP's; G: (DiLoCo's held-out loss - DDP's) / DDP's, after the same tokens, on
--task. G means something only where the loss has a floor above 0: on ``sort`` DDP's loss
goes towards 0 and a fixed gap becomes a large relative one, so the goal G <= 0.05 is
measured on ``markov``; the excess-loss gap (loss - floor, DiLoCo's over DDP's, minus 1) is
the fairer measure and is printed beside it.
"""
from __future__ import annotations

import json
import math
import time

import torch

from source_code.cli import Parser, positive_float, positive_int, writable_path
from source_code.distributed import LaunchError, print0, ranks_from_env, run_main, session
from source_code.less_communication import harness, links, tasks

LAUNCH = "torchrun --standalone --nproc-per-node=2 -m source_code.less_communication.train"


def sweep_list(text: str) -> tuple:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise LaunchError(f"error: --sweep takes integers separated by commas (e.g. 10,40), got {text!r}") from None
    if not values or min(values) < 1:
        raise LaunchError(f"error: --sweep needs values >= 1 (e.g. 10,40), got {text!r}")
    return values


def parse_args(argv=None):
    d = harness.DEFAULTS
    p = Parser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=positive_int, default=d["steps"])
    p.add_argument("--batch", type=positive_int, default=d["batch"], help="global batch (sequences)")
    p.add_argument("--lr", type=positive_float, default=d["lr"], help="AdamW (DDP, inner steps)")
    p.add_argument("--sgd-lr", type=positive_float, default=None,
                   help="SGD of the hook runs (default: the task's, tasks.SGD_LR)")
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
    p.add_argument("--seed", type=int, default=0)
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
    sweep = sweep_list(args.sweep)
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
    if args.batch % world:
        raise LaunchError(f"error: --batch {args.batch} does not divide among {world} ranks; "
                          f"use a multiple of {world}")
    if args.dim % 4:
        raise LaunchError(f"error: --dim {args.dim} must be a multiple of the 4 attention heads")
    if not 0 <= args.seed < 2**31:
        raise LaunchError(f"error: --seed must be in [0, 2**31), got {args.seed}")
    return harness.settings_with(steps=args.steps, batch=args.batch, lr=args.lr, sgd_lr=args.sgd_lr,
                                 dim=args.dim, layers=args.layers, rank=args.rank, every=args.every,
                                 sweep=sweep, fragments=args.fragments, link=args.link, seed=args.seed,
                                 delay=args.delay, goals_only=args.goals_only, task=args.task)


def ratios(results: dict) -> dict:
    """P, D and G of the summary line (see the module docstring)."""
    runs, h = results["runs"], results["settings"]["every"]
    return {"powersgd_bytes_ratio": runs["powersgd"]["bytes_per_step"] / runs["ddp-sgd"]["bytes_per_step"],
            "diloco_bytes_ratio": runs[f"diloco-{h}"]["bytes_per_step"] / runs["ddp"]["bytes_per_step"],
            "diloco_loss_gap": (runs[f"diloco-{h}"]["eval"] - runs["ddp"]["eval"]) / runs["ddp"]["eval"]}


def gaps(runs: dict, every: int, floor: float) -> str:
    """DiLoCo at H against DDP: the relative gap G and the gap in excess loss over ``floor``."""
    ddp, diloco = runs["ddp"]["eval"], runs[f"diloco-{every}"]["eval"]
    try:
        excess = f"{tasks.excess_gap(diloco, ddp, floor):.4f}"
    except ValueError:
        excess = "undefined (DDP at the floor)"
    return (f"DiLoCo H={every} {diloco:.4f} against DDP {ddp:.4f}: relative gap G {(diloco - ddp) / ddp:.4f}, "
            f"gap in excess loss over the floor {excess} (DDP's excess {ddp - floor:.4f})")


def main(argv=None):
    args = parse_args(argv)
    settings = check(args)
    torch.set_num_threads(1)
    start = time.perf_counter()
    with session(launch_hint=LAUNCH, seed=args.seed) as ctx:
        print0(f"{len(harness.methods(settings))} methods, {settings['steps']} steps each, "
               f"{ctx.world_size} processes, {ctx.backend} on {ctx.device.type}")
        results = harness.experiment(settings)
    if results is None:
        return 0
    base = results["runs"]["ddp"]
    for method, run in results["runs"].items():
        t = harness.replay_time(run, settings["link"])[-1]
        print(f"{method:18s} held-out loss {run['eval']:.4f}  bytes/step {run['bytes_per_step']:9.0f} "
              f"({run['bytes_per_step'] / base['bytes_per_step']:.3f} of DDP's)  "
              f"{t:6.2f} s on the {settings['link']} link", flush=True)
    if "overlap" in results:
        ov = results["overlap"]
        print(f"streaming DiLoCo, all-reduces in flight on the {settings['link']} link: waited "
              f"{ov['tau0']['exposed_s']:.2f} s at tau=0, {ov['overlap']['exposed_s']:.2f} s at "
              f"tau={settings['delay']}, of {ov['overlap']['modelled_s']:.2f} s modelled", flush=True)
    fl = results["floor"]
    print(f"floor of the {fl['task']} task: {fl['expected']:.4f} expected, {fl['held_out']:.4f} on the held-out "
          f"set; {gaps(results['runs'], settings['every'], fl['held_out'])}", flush=True)
    if "floor_runs" in results:
        fl = results["floor_runs"]["floor"]
        print(f"on the {fl['task']} task (floor {fl['held_out']:.4f} on its held-out set): "
              f"{gaps(results['floor_runs']['runs'], settings['every'], fl['held_out'])}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f)
    r = ratios(results)
    print(f"summary: world_size={results['runs']['ddp']['world']} methods={len(results['runs'])} steps={settings['steps']} "
          f"rank={settings['rank']} every={settings['every']} task={settings['task']} seconds={time.perf_counter() - start:.1f} "
          + " ".join(f"{k}={v:.4f}" for k, v in r.items()), flush=True)
    return 0


if __name__ == "__main__":
    run_main(main)
