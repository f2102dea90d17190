"""Parity: ZeRO-1, ZeRO-2 (by hand), torch's ZeroRedundancyOptimizer and FSDP2 vs one process.

    torchrun --standalone --nproc-per-node=2 -m source_code.sharding.parity
    torchrun --standalone --nproc-per-node=4 -m source_code.sharding.parity --steps 8

Every implementation trains the same TransformerLM (same initial weights, workload.py) with
AdamW on the same global batches of the sort task, each rank on its B/N samples; rank 0 also
trains the one-process reference on the whole global batch. Printed, one line each:

    parity: impl=zero1 world_size=N steps=S max_abs_diff=D

(the largest difference of any weight from the reference after S steps); exit 1 when any
D > --tol (1e-6).
"""
from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

from source_code.distributed import LaunchError, print0, run_main, session
from source_code import workload
from source_code.sharding.fsdp import build_sharded
from source_code.measure import is_dtensor
from source_code.sharding.zero import ZeroAdamW

LAUNCH = "torchrun --standalone --nproc-per-node=2 -m source_code.sharding.parity"
IMPLS = ("zero1", "zero2", "torch_zero", "fsdp")


def full_weights(model) -> list[torch.Tensor]:
    """Every parameter as a full tensor (collective for sharded ones: call on all ranks)."""
    return [(p.full_tensor() if is_dtensor(p) else p).detach().cpu().clone()
            for p in model.parameters()]


def _make(impl: str, ctx, cfg, args):
    lr = {"lr": args.lr, "weight_decay": 0.01}
    if impl in ("zero1", "zero2"):
        model = workload.build_model(cfg, args.seed, ctx.device)
        return model, ZeroAdamW(model, stage=int(impl[-1]), **lr)
    if impl == "torch_zero":
        model = DDP(workload.build_model(cfg, args.seed, ctx.device), device_ids=ctx.device_ids)
        return model, ZeroRedundancyOptimizer(model.parameters(), torch.optim.AdamW, **lr)
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    model = build_sharded(cfg, mesh, args.seed, ctx.device, meta=True)
    return model, torch.optim.AdamW(model.parameters(), **lr)


def train(model, opt, dataset, args, rank: int, world: int, device, split: int = 1) -> None:
    """``args.steps`` AdamW steps on this rank's slice of each global batch.

    split > 1 (the one-process reference): the global batch is processed as ``split`` slices
    whose gradients add up (each loss / split), i.e. the mean of the per-slice mean losses,
    exactly what the ranks compute together.
    """
    for step in range(args.steps):
        batch = workload.global_batch(dataset, step, args.batch_size, args.seed)
        for part in range(split):
            x, y = workload.rank_slice(batch, rank + part, world * split)
            loss = workload.loss_fn(model, x.to(device), y.to(device)) / split
            loss.backward()
        opt.step()
        opt.zero_grad()


def run(ctx, args) -> dict:
    cfg = workload.model_config(dim=args.dim, n_layers=args.layers)
    dataset = workload.sort_task(n=512)
    reference = None
    if ctx.is_main:
        ref = workload.build_model(cfg, args.seed, ctx.device)
        ref_opt = torch.optim.AdamW(ref.parameters(), lr=args.lr, weight_decay=0.01)
        train(ref, ref_opt, dataset, args, 0, 1, ctx.device, split=ctx.world_size)
        reference = full_weights(ref)
        if ctx.world_size > 1:  # context: the same run without splitting the batch
            whole = workload.build_model(cfg, args.seed, ctx.device)
            whole_opt = torch.optim.AdamW(whole.parameters(), lr=args.lr, weight_decay=0.01)
            train(whole, whole_opt, dataset, args, 0, 1, ctx.device)
            d = max((a - b).abs().max().item() for a, b in zip(full_weights(whole), reference))
            print0(f"note: one process on the unsplit batch differs from the {ctx.world_size}-way "
                   f"split by max_abs_diff={d:.3g} (float rounding of the split, amplified by "
                   f"Adam's division by sqrt(v): the split itself, sharded or not)")
    diffs = {}
    for impl in args.impls:
        model, opt = _make(impl, ctx, cfg, args)
        train(model, opt, dataset, args, ctx.rank, ctx.world_size, ctx.device)
        got = full_weights(getattr(model, "module", model))
        if ctx.is_main:
            diffs[impl] = max((a - b).abs().max().item() for a, b in zip(got, reference))
            print0(f"parity: impl={impl} world_size={ctx.world_size} device={ctx.device} steps={args.steps} "
                   f"max_abs_diff={diffs[impl]:.3g}")
        del model, opt
    dist.barrier()
    return diffs


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=16, help="global batch (divisible by N)")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tol", type=float, default=1e-6)
    p.add_argument("--impls", nargs="+", default=list(IMPLS), choices=IMPLS)
    args = p.parse_args(argv)
    if args.steps < 1 or args.dim % 4:
        raise LaunchError("error: --steps must be >= 1 and --dim a multiple of 4 (the heads)")
    from source_code.distributed import ranks_from_env
    found = ranks_from_env()
    world = found[2] if found else 1
    if args.batch_size % world:
        raise LaunchError(f"error: --batch-size {args.batch_size} does not divide among {world} "
                          f"processes; use a multiple of {world}")
    torch.set_num_threads(1)
    with session(launch_hint=LAUNCH, allow_single=True) as ctx:
        diffs = run(ctx, args)
    worst = max(diffs.values(), default=0.0)
    if worst > args.tol:
        print0(f"FAILED: max_abs_diff {worst:.3g} > tol {args.tol:g}")
        return 1
    return 0


if __name__ == "__main__":
    run_main(main)
