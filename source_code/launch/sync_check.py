"""Who is who in a launched job, and are the replicas really in sync?

    torchrun --standalone --nproc-per-node=2 -m source_code.launch.sync_check
    srun python -m source_code.launch.sync_check              # inside an sbatch allocation
    TRAIN_MODULE=source_code.launch.sync_check sbatch slurm/ddp_multinode.slurm

Every rank reports where it runs (rank 0 gathers the reports and prints one line per rank):

    rank 1/4 local_rank=1 node=n1 launcher=torchrun device=cpu

then all ranks train the same model with DDP for a few SGD steps, each on its shard of the
global batch; afterwards a checksum of every rank's weights is gathered (all equal: the
replicas are in sync), and rank 0 repeats the training in ONE process on the whole global
batch: the largest difference between the weights is the parity with the single-process
reference:

    sync: world_size=4 nodes=2 steps=5 in_sync=True max_abs_diff=2.2e-08
"""
from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from source_code.cli import Parser, positive_float, positive_int
from source_code import data, models
from source_code.device_policy import exact_math
from source_code.distributed import print0, run_main, session
from source_code.errors import LaunchError

LAUNCH = "torchrun --standalone --nproc-per-node=2 -m source_code.launch.sync_check"


def _model(seed: int, device) -> torch.nn.Module:
    torch.manual_seed(seed)
    return models.SmallCNN(in_channels=1, width=8).to(device)


def _batches(global_batch: int, steps: int):
    x, y = data.digits("train").tensors
    return [(x[i * global_batch:(i + 1) * global_batch], y[i * global_batch:(i + 1) * global_batch])
            for i in range(steps)]


def _sgd(model, batches, lr, shard=None):
    """Plain SGD; ``shard=(rank, world)`` trains on this rank's contiguous slice of each batch."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    device = next(model.parameters()).device
    for x, y in batches:
        if shard:
            rank, world = shard
            n = len(x) // world
            x, y = x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x.to(device)), y.to(device)).backward()
        opt.step()


def flat_weights(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).double().cpu() for p in model.parameters()])


def check(ctx, args) -> dict:
    me = {"rank": ctx.rank, "local_rank": ctx.local_rank, "node": socket.gethostname(),
          "launcher": ctx.launcher, "device": str(ctx.device)}
    everyone = [None] * ctx.world_size
    dist.all_gather_object(everyone, me)
    for r in everyone:
        print0(f"rank {r['rank']}/{ctx.world_size} local_rank={r['local_rank']} node={r['node']} "
               f"launcher={r['launcher']} device={r['device']}")

    batches = _batches(args.batch_size, args.steps)
    ddp = DDP(_model(args.seed, ctx.device), device_ids=ctx.device_ids)
    _sgd(ddp, batches, args.lr, shard=(ctx.rank, ctx.world_size))
    mine = flat_weights(ddp.module)
    del ddp
    sums = torch.zeros(ctx.world_size, dtype=torch.float64)
    sums[ctx.rank] = mine.sum() + (mine.abs() * torch.arange(1, len(mine) + 1)).sum()
    dist.all_reduce(sums)  # each rank fills its own slot: an all_gather of the checksums
    in_sync = bool((sums == sums[0]).all())

    result = {"world_size": ctx.world_size, "nodes": len({r["node"] for r in everyone}),
              "steps": args.steps, "in_sync": in_sync}
    if ctx.is_main:
        reference = _model(args.seed, ctx.device)
        _sgd(reference, batches, args.lr)
        result["max_abs_diff"] = (flat_weights(reference) - mine).abs().max().item()
        print0("sync: " + " ".join(f"{k}={v:.2g}" if isinstance(v, float) else f"{k}={v}"
                                   for k, v in result.items()))
    return result


def parse(text: str) -> dict:
    """The key=value pairs of the ``sync:`` line, typed."""
    line = [ln for ln in text.splitlines() if "sync: " in ln][-1]
    pairs = dict(kv.split("=") for kv in line[line.index("sync: ") + 6:].split())
    conv = {"world_size": int, "nodes": int, "steps": int, "max_abs_diff": float,
            "in_sync": lambda v: v == "True"}
    return {k: conv.get(k, str)(v) for k, v in pairs.items()}


def main(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=positive_int, default=5)
    p.add_argument("--batch-size", type=positive_int, default=48, help="global batch, split among ranks")
    p.add_argument("--lr", type=positive_float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", 1)))
    with session(launch_hint=LAUNCH) as ctx:
        if args.batch_size % ctx.world_size:
            raise LaunchError(f"error: --batch-size {args.batch_size} does not divide among "
                              f"{ctx.world_size} ranks; use a multiple of {ctx.world_size}")
        exact_math()  # TF32 and cuDNN autotuning would break the comparison on a GPU
        check(ctx, args)
    return 0


if __name__ == "__main__":
    run_main(main)
