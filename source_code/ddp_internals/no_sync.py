"""Gradient accumulation with no_sync(): k micro-batches, ONE all-reduce, same step as a k-times larger batch.

    torchrun --standalone --nproc-per-node=2 -m source_code.ddp_internals.no_sync
    torchrun --standalone --nproc-per-node=2 -m source_code.ddp_internals.no_sync --k 8 --micro 4

Gradients add up across backward() calls. Under ``model.no_sync()`` DDP skips the all-reduce,
so the first k-1 micro-batches only accumulate local gradients; the k-th backward (outside
no_sync) all-reduces the accumulated sum once. With each micro-batch loss divided by k, the
result equals one step on the k-times larger batch -- at 1/k of the communication. This
script checks it for torch's DDP and for the hand-made BucketedDDP (its own ``no_sync``):
weights after the step differ by at most --tol from the large-batch step, else it fails.
"""
from __future__ import annotations


import torch
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from source_code.cli import Parser, positive_float, positive_int
from source_code import data, models
from source_code.ddp_internals.bucketed import BucketedDDP
from source_code.distributed import print0, run_main, session
from source_code.errors import LaunchError

LAUNCH = "torchrun --standalone --nproc-per-node=2 -m source_code.ddp_internals.no_sync"


def _counting_allreduce(state: dict, bucket):
    """torch DDP comm hook: the default averaging all-reduce, counted."""
    state["calls"] += 1
    return default_hooks.allreduce_hook(None, bucket)


def wrap(kind: str, ctx, seed: int, bucket_mb: float):
    """(wrapped model, optimizer, counter) for kind 'torch' or 'own', from the same seeded init."""
    torch.manual_seed(seed)
    net = models.SmallCNN(width=8).to(ctx.device)
    if kind == "torch":
        model, counter = DDP(net, device_ids=ctx.device_ids, bucket_cap_mb=bucket_mb), {"calls": 0}
        model.register_comm_hook(counter, _counting_allreduce)
    else:
        model, counter = BucketedDDP(net, bucket_mb=bucket_mb), None
    return model, torch.optim.SGD(net.parameters(), lr=0.1), counter


def _calls(model, counter) -> int:
    return counter["calls"] if counter is not None else model.collectives


def accumulate_vs_large_batch(ctx, kind: str, k: int, micro: int, seed: int = 0,
                              bucket_mb: float = 0.01) -> dict:
    """One optimizer step both ways; returns max |w_accumulated - w_large| and all-reduce counts."""
    x_all, y_all = data.digits("train").tensors
    start = ctx.rank * k * micro  # each rank its own k*micro samples
    x, y = x_all[start:start + k * micro].to(ctx.device), y_all[start:start + k * micro].to(ctx.device)

    acc, acc_opt, acc_count = wrap(kind, ctx, seed, bucket_mb)
    for i in range(k):
        xb, yb = x[i * micro:(i + 1) * micro], y[i * micro:(i + 1) * micro]
        if i < k - 1:
            with acc.no_sync():  # forward AND backward inside: no communication
                (F.cross_entropy(acc(xb), yb) / k).backward()
        else:
            (F.cross_entropy(acc(xb), yb) / k).backward()  # this one all-reduces the sum
    acc_opt.step()

    big, big_opt, big_count = wrap(kind, ctx, seed, bucket_mb)
    F.cross_entropy(big(x), y).backward()
    big_opt.step()

    diff = max((a - b).abs().max().item()
               for a, b in zip(acc.module.parameters(), big.module.parameters()))
    return {"kind": kind, "k": k, "max_abs_diff": diff,
            "allreduce_calls": _calls(acc, acc_count), "calls_per_sync": _calls(big, big_count)}


def main(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--k", type=positive_int, default=4, help="micro-batches accumulated per optimizer step")
    p.add_argument("--micro", type=positive_int, default=8, help="samples per micro-batch per rank")
    p.add_argument("--bucket-mb", type=positive_float, default=0.01)
    p.add_argument("--tol", type=positive_float, default=1e-5)
    args = p.parse_args(argv)
    if args.k < 1 or args.micro < 1:
        raise LaunchError("error: --k and --micro must be at least 1")
    torch.set_num_threads(1)
    with session(launch_hint=LAUNCH, allow_single=True) as ctx:
        results = [accumulate_vs_large_batch(ctx, kind, args.k, args.micro, bucket_mb=args.bucket_mb)
                   for kind in ("torch", "own")]
        for r in results:
            print0(f"no_sync: impl={r['kind']} k={r['k']} max_abs_diff={r['max_abs_diff']:.2e} "
                   f"allreduce_calls={r['allreduce_calls']} (syncing every micro-batch: "
                   f"{r['k'] * r['calls_per_sync']}) every_microbatch_calls={r['k'] * r['calls_per_sync']}")
    worst = max(r["max_abs_diff"] for r in results)  # equal on all ranks (synced weights)
    if worst > args.tol:
        raise LaunchError(f"error: accumulated step differs from the large-batch step by {worst:.2e} > {args.tol}")
    return 0


if __name__ == "__main__":
    run_main(main)
