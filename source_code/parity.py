"""Parity: N-process DDP equals one process trained on the same global batches.

    torchrun --standalone --nproc-per-node=2 -m source_code.parity
    torchrun --standalone --nproc-per-node=4 -m source_code.parity --epochs 3 --samples 512
    torchrun --standalone --nproc-per-node=2 -m source_code.parity --break sum   # must FAIL

Every rank trains SmallCNN with DDP, a DistributedSampler and plain SGD (no momentum, so a
difference cannot hide in the optimizer state). Rank 0 also trains a one-process reference:
at each step it concatenates exactly the samples the N ranks saw (their shards of the
shuffled order, recomputed here the way DistributedSampler does it) and weights each rank's
samples like DDP does (mean over ranks of each rank's mean loss). Printed:

    parity: world_size=N steps=S max_abs_diff=D

and the run fails (exit 1) when D > --tol (by default ``tolerance``: 1e-5 on the CPU, 1e-4 on
a GPU; the line before says which and why). --break shows that the check can fail:
``sum`` adds the ranks' gradients instead of averaging them, ``no-set-epoch`` forgets
sampler.set_epoch so every epoch repeats the first one's order while the reference reshuffles.
"""
from __future__ import annotations


import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Subset
from torch.utils.data.distributed import DistributedSampler

from source_code.cli import Parser, positive_float, positive_int
from source_code import data, models
from source_code.device_policy import exact_math
from source_code.distributed import print0, run_main, session
from source_code.errors import LaunchError
from source_code.training import loop

LAUNCH = "torchrun --standalone --nproc-per-node=2 -m source_code.parity"
BREAKS = ("none", "sum", "no-set-epoch")
CPU_TOL = 1e-5    # fp32, gloo: this check measures ~3e-8 after its 12 steps (notebook 05)
CUDA_FACTOR = 10  # see tolerance()


def tolerance(device, cpu: float = CPU_TOL) -> tuple[float, str]:
    """(largest accepted max |difference|, why) for an fp32 parity check computing on ``device``.

    On the CPU with gloo: ``cpu``, the tolerance each check states for itself (this one 1e-5;
    the pipeline's 1e-6). On CUDA: CUDA_FACTOR x ``cpu``. The math is the same, exact_math()
    turns TF32 off, but the sums run in other orders than on the CPU, and differently for the
    reference than for the ranks: cuBLAS and cuDNN choose kernels (how they split a sum over
    the batch) by shape, so one process on the whole batch and N on their shards add their
    samples in different orders; at 3 or more ranks NCCL's rings and trees add the ranks'
    gradients in an order that differs from chunk to chunk (gloo's 2 ranks: a + b, the same
    everywhere). Each order is off by float32 rounding, which the training steps carry on.
    The factor is a margin over rounding of that size, not a GPU measurement: `make gpu-smoke`
    prints the measured difference."""
    if torch.device(device).type == "cuda":
        return CUDA_FACTOR * cpu, (f"tolerance {CUDA_FACTOR * cpu:g} on {device}: {CUDA_FACTOR} x the "
                                   f"CPU's {cpu:g} (GPU kernels and NCCL sum in other orders)")
    return cpu, f"tolerance {cpu:g} on {device} (fp32)"


def rank_indices(n: int, world_size: int, rank: int, epoch: int, seed: int = 0) -> list[int]:
    """The indices DistributedSampler(shuffle=True, drop_last=False) gives ``rank`` in ``epoch``.

    Shuffle with a generator seeded seed + epoch (the same on all ranks), pad by repeating the
    start so the length divides by world_size, then take every world_size-th index from rank.
    """
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
    total = -(-n // world_size) * world_size
    order += (order * (total // n + 1))[: total - n]
    return order[rank:total:world_size]


def _summed_gradients(state, bucket):
    """A broken DDP comm hook: all-reduce SUM without dividing by the world size."""
    import torch.distributed as dist
    fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def _model(seed: int, device):
    torch.manual_seed(seed)
    return models.SmallCNN(width=8).to(device)


def run(ctx, args) -> dict:
    dataset = Subset(data.load("digits", "train"), range(args.samples))
    per_rank = args.batch_size // ctx.world_size
    sampler = DistributedSampler(dataset, ctx.world_size, ctx.rank, shuffle=True, seed=args.seed)
    loader = DataLoader(dataset, batch_size=per_rank, sampler=sampler)
    ddp = DDP(_model(args.seed, ctx.device), device_ids=ctx.device_ids)
    if args.break_ == "sum":
        ddp.register_comm_hook(None, _summed_gradients)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)

    ref = ref_opt = None
    if ctx.is_main:
        ref = _model(args.seed, ctx.device)
        ref_opt = torch.optim.SGD(ref.parameters(), lr=args.lr)
    xs, ys = dataset.dataset.tensors
    steps = 0
    for epoch in range(args.epochs):
        if args.break_ != "no-set-epoch":
            sampler.set_epoch(epoch)
        for b, (x, y) in enumerate(loader):
            opt.zero_grad()
            F.cross_entropy(ddp(x.to(ctx.device)), y.to(ctx.device)).backward()
            opt.step()
            if ref is not None:  # the same step, in one process, on the concatenated batch
                shards = [rank_indices(len(dataset), ctx.world_size, r, epoch, args.seed)
                          [b * per_rank:(b + 1) * per_rank] for r in range(ctx.world_size)]
                idx = torch.tensor([i for s in shards for i in s])
                weight = torch.cat([torch.full((len(s),), 1.0 / (len(s) * ctx.world_size)) for s in shards])
                ref_opt.zero_grad()
                losses = F.cross_entropy(ref(xs[idx].to(ctx.device)), ys[idx].to(ctx.device), reduction="none")
                (losses * weight.to(ctx.device)).sum().backward()
                ref_opt.step()
            steps += 1
    diff = torch.zeros(1, dtype=torch.float64, device=ctx.device)
    if ref is not None:
        diff[0] = max((p - q).abs().max().item() for p, q in zip(ddp.module.parameters(), ref.parameters()))
    torch.distributed.broadcast(diff, src=0)  # every rank learns the verdict, so all exit alike
    del ddp, opt, ref, ref_opt
    return {"steps": steps, "max_abs_diff": diff.item()}


def main(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=positive_int, default=256, help="first SAMPLES digits images")
    p.add_argument("--batch-size", type=positive_int, default=64, help="GLOBAL batch size")
    p.add_argument("--epochs", type=positive_int, default=3)
    p.add_argument("--lr", type=positive_float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tol", type=positive_float, default=None,
                   help=f"largest accepted difference (default: {CPU_TOL:g} on the CPU, "
                        f"{CUDA_FACTOR * CPU_TOL:g} on a GPU)")
    p.add_argument("--break", dest="break_", choices=BREAKS, default="none",
                   help="deliberately break DDP to see the check fail")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    with session(launch_hint=LAUNCH) as ctx:
        loop.per_rank_batch(args.batch_size, ctx.world_size)  # one-line error if it does not divide
        print0(exact_math())  # TF32 and cuDNN autotuning would break 1e-5 on a GPU
        tol, why = (args.tol, f"tolerance {args.tol:g} (--tol)") if args.tol else tolerance(ctx.device)
        print0(why)
        res = run(ctx, args)
        print0(f"parity: world_size={ctx.world_size} steps={res['steps']} "
               f"max_abs_diff={res['max_abs_diff']:.3e}")
    if res["max_abs_diff"] > tol:
        raise LaunchError(f"error: DDP and the one-process reference differ by "
                          f"{res['max_abs_diff']:.3e} > tolerance {tol:g}")
    return 0


if __name__ == "__main__":
    run_main(main)
