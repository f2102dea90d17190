"""Own naive DDP vs own bucketed DDPs vs torch's DDP: the same training, side by side, in one run.

    torchrun --standalone --nproc-per-node=2 -m source_code.ddp_internals.compare
    torchrun --standalone --nproc-per-node=2 -m source_code.ddp_internals.compare --steps 100 --width 64 --out times.json

Copies of the same model (same seed) are trained on the same batches, interleaved step by
step (the order rotates every step, so a noisy neighbour slows all alike):

    naive         one all-reduce per parameter tensor, after backward()
    no-overlap    buckets, all sent after backward()       (the effect of bucketing alone)
    bucketed      buckets sent during backward()           (+ the effect of overlap)
    views         bucketed, .grad are views into the buckets (+ no copies, as torch's DDP)
    torch         torch.nn.parallel.DistributedDataParallel

Printed: a table of step times (median over the steps after --warmup), the median over the
steps of the per-step ratio own/torch (each step's times were taken back to back, so this
ratio is the least disturbed by a busy machine), and the largest absolute difference between
the sets of final weights; the run fails if that exceeds --tol, because all must compute the
same averaged gradients. Rank 0's step times are reported; --out writes them all as JSON for
plotting (notebook 05).
"""
from __future__ import annotations

import itertools
import json
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from source_code.cli import Parser, nonnegative_int, positive_float, positive_int
from source_code import data, models
from source_code.ddp_internals.bucketed import BucketedDDP
from source_code.ddp_internals.naive import NaiveDDP
from source_code.device_policy import exact_math
from source_code.distributed import print0, run_main, session
from source_code.errors import LaunchError
from source_code.training import loop

LAUNCH = "torchrun --standalone --nproc-per-node=2 -m source_code.ddp_internals.compare"
IMPLS = ("naive", "no-overlap", "bucketed", "views", "torch")


def build(kind: str, ctx, args):
    torch.manual_seed(args.seed)  # identical initial weights for the three
    net = models.SmallCNN(width=args.width).to(ctx.device)
    if kind == "naive":
        model = NaiveDDP(net)
    elif kind in ("no-overlap", "bucketed", "views"):
        model = BucketedDDP(net, bucket_mb=args.bucket_mb, overlap=kind != "no-overlap",
                            grad_views=kind == "views")
    else:
        model = DDP(net, device_ids=ctx.device_ids, bucket_cap_mb=args.bucket_mb)
    return model, torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9)


def timed_step(model, opt, x, y, device) -> float:
    start = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()  # the same loop for every wrapper, torch's included
    opt.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def max_abs_diff(a, b) -> float:
    return max((p - q).abs().max().item() for p, q in zip(a.module.parameters(), b.module.parameters()))


def run(ctx, args) -> dict:
    train_set = data.load("digits", "train")
    per_rank = args.batch_size // ctx.world_size
    sampler = DistributedSampler(train_set, ctx.world_size, ctx.rank, shuffle=True, seed=args.seed)
    loader = DataLoader(train_set, batch_size=per_rank, sampler=sampler, drop_last=True)
    runs = {k: build(k, ctx, args) for k in IMPLS}
    times = {k: [] for k in IMPLS}
    step, epoch = 0, 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            x, y = x.to(ctx.device), y.to(ctx.device)
            k = step % len(IMPLS)
            order = IMPLS[k:] + IMPLS[:k]  # rotate who goes first
            for kind in order:
                times[kind].append(timed_step(*runs[kind], x, y, ctx.device))
            step += 1
            if step == args.steps:
                break
        epoch += 1
    diffs = {f"{a}-{b}": max_abs_diff(runs[a][0], runs[b][0]) for a, b in itertools.combinations(IMPLS, 2)}
    collectives = {k: getattr(runs[k][0], "collectives", None) for k in IMPLS}
    del runs  # free the DDP modules inside the session (clean exit)
    return {"times": times, "diffs": diffs, "collectives": collectives}


def step_ratio(times, reference, warmup: int) -> float:
    """Median over the steps of time / reference time of the same step (taken back to back)."""
    return statistics.median(a / b for a, b in zip(times[warmup:], reference[warmup:]))


def report(res: dict, args) -> None:
    print0(f"{'implementation':<15}{'median ms':>10}{'mean ms':>10}{'vs torch':>10}{'all_reduce/step':>17}")
    med = {k: statistics.median(v[args.warmup:]) * 1e3 for k, v in res["times"].items()}
    for k, v in res["times"].items():
        calls = res["collectives"][k]
        per_step = f"{calls / args.steps:.0f}" if calls is not None else "(internal)"
        print0(f"{k:<15}{med[k]:>10.2f}{statistics.mean(v[args.warmup:]) * 1e3:>10.2f}"
               f"{med[k] / med['torch']:>10.2f}{per_step:>17}")
    ratios = {k: step_ratio(res["times"][k], res["times"]["torch"], args.warmup) for k in IMPLS[:-1]}
    print0("per-step ratio to torch's DDP (median over steps): "
           + ", ".join(f"{k} {r:.2f}x" for k, r in ratios.items()))
    for k in IMPLS:
        print0(f"compare: impl={k} median_ms={med[k]:.3f}"
               + (f" ratio_to_torch={ratios[k]:.3f}" if k in ratios else ""))
    print0("compare: " + " ".join(f"max_abs_diff[{k}]={v:.2e}" for k, v in res["diffs"].items()))


def main(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=positive_int, default=30)
    p.add_argument("--warmup", type=nonnegative_int, default=3, help="first steps left out of the timing")
    p.add_argument("--batch-size", type=positive_int, default=64, help="global batch size")
    p.add_argument("--width", type=positive_int, default=32, help="SmallCNN width (parameters grow ~width^2)")
    p.add_argument("--bucket-mb", type=positive_float, default=0.25)
    p.add_argument("--lr", type=positive_float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tol", type=positive_float, default=1e-5)
    p.add_argument("--out", default="", help="write rank 0's step times and the differences as JSON")
    args = p.parse_args(argv)
    if args.steps <= args.warmup:
        raise LaunchError(f"error: --steps {args.steps} must exceed --warmup {args.warmup}")
    torch.set_num_threads(1)
    with session(launch_hint=LAUNCH) as ctx:
        loop.per_rank_batch(args.batch_size, ctx.world_size)  # one-line error if it does not divide
        print0(f"{ctx.world_size} processes, {ctx.backend} on {ctx.device}; {exact_math()}")  # TF32 and cuDNN autotuning would break 1e-5 on a GPU
        res = run(ctx, args)
        report(res, args)
        if ctx.is_main and args.out:
            with open(args.out, "w") as f:
                json.dump({"world_size": ctx.world_size, "warmup": args.warmup, **res}, f)
    worst = max(res["diffs"].values())
    if worst > args.tol:
        raise LaunchError(f"error: final weights differ by {worst:.2e} > --tol {args.tol}")
    return 0


if __name__ == "__main__":
    run_main(main)
