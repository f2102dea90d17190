"""Validation on every rank instead of rank 0 alone, with the metric computed right.

    torchrun --standalone --nproc-per-node=3 -m source_code.training.evaluation

Rank 0 evaluating the whole held-out set (ddp.py) is right and simple while that set is small:
the other ranks wait a moment. When it is large, every rank evaluates a share and the shares are
combined. Three ways to combine them, of which one is right whatever the sizes:

* **sum, then divide** (``evaluate_sharded``): each rank counts its correct predictions and its
  samples; one all-reduce adds both; accuracy = total correct / total samples. Equal to rank 0
  evaluating everything, for any number of ranks, exactly (integer counts);
* **mean of the ranks' accuracies**: right only when every shard has the same size; with N
  samples on W ranks and N % W != 0 the smaller shards weigh more than their share;
* **DistributedSampler(shuffle=False)** on the test set: it pads the shards to equal size by
  repeating samples from the start (``drop_last=False``), so W - N % W samples are counted twice;
  with ``drop_last=True`` it leaves N % W samples out instead. Fine for training, where an epoch
  is a pass over shuffled data; wrong for a metric that should see every sample once.

The shards here are ``range(rank, N, world_size)``: disjoint, complete, no padding.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Subset
from torch.utils.data.distributed import DistributedSampler

from source_code.distributed import report_device


def shard(dataset, rank: int, world_size: int) -> Subset:
    """Every ``world_size``-th sample from ``rank`` on: disjoint, complete, no repeats."""
    return Subset(dataset, range(rank, len(dataset), world_size))


@torch.no_grad()
def counts(model, dataset, device, batch_size: int = 256) -> tuple[int, int]:
    """(correct, seen) of ``model`` on ``dataset`` (one process, no collectives)."""
    model.eval()
    correct, seen = torch.zeros((), dtype=torch.long, device=device), 0
    for x, y in DataLoader(dataset, batch_size=batch_size):
        correct += (model(x.to(device)).argmax(dim=1) == y.to(device)).sum()
        seen += len(y)
    return int(correct.item()), seen


def evaluate_sharded(model, dataset, device, group=None) -> float:
    """Accuracy over the whole ``dataset``, each rank scoring its shard: sum, then divide."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    correct, seen = counts(model, shard(dataset, rank, world), device)
    total = torch.tensor([correct, seen], dtype=torch.float64, device=report_device(group))
    dist.all_reduce(total, group=group)           # [sum of correct, sum of samples]
    return (total[0] / total[1]).item()


def mean_of_rank_accuracies(model, dataset, device, group=None) -> float:
    """The tempting shortcut: each rank's accuracy, averaged over ranks (wrong if shards differ)."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    correct, seen = counts(model, shard(dataset, rank, world), device)
    acc = torch.tensor([correct / seen], dtype=torch.float64, device=report_device(group))
    dist.all_reduce(acc, group=group)
    return acc.item() / world


def padded_sampler_accuracy(model, dataset, device, drop_last: bool, group=None) -> tuple[float, int]:
    """Sum-then-divide over DistributedSampler's shards: (accuracy, samples counted in all)."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=False,
                                 drop_last=drop_last)
    correct, seen = counts(model, Subset(dataset, list(sampler)), device)
    total = torch.tensor([correct, seen], dtype=torch.float64, device=report_device(group))
    dist.all_reduce(total, group=group)
    return (total[0] / total[1]).item(), int(total[1].item())


def compare(n_samples: int = 359, epochs: int = 1, seed: int = 0) -> dict:
    """On each rank: the four numbers for a SmallCNN trained ``epochs`` on the digits, evaluated
    on the first ``n_samples`` held-out digits (359 of 360: uneven on 2, 3, 4 ... ranks)."""
    from source_code import data, models
    from source_code.distributed import context
    ctx = context()
    torch.manual_seed(seed)
    model = models.build_model("smallcnn").to(ctx.device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for _ in range(epochs):  # the same model on every rank: same seed, same full-batch order
        for x, y in DataLoader(data.load("digits", "train"), batch_size=64):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x.to(ctx.device)), y.to(ctx.device)).backward()
            opt.step()
    test = Subset(data.load("digits", "test"), range(n_samples))
    correct, seen = counts(model, test, ctx.device)   # rank 0 alone, the reference
    padded, padded_n = padded_sampler_accuracy(model, test, ctx.device, drop_last=False)
    dropped, dropped_n = padded_sampler_accuracy(model, test, ctx.device, drop_last=True)
    return {"reference": correct / seen, "sharded": evaluate_sharded(model, test, ctx.device),
            "mean_of_ranks": mean_of_rank_accuracies(model, test, ctx.device),
            "padded": padded, "padded_samples": padded_n, "dropped": dropped,
            "dropped_samples": dropped_n, "samples": seen, "world_size": ctx.world_size,
            "device": str(ctx.device)}


def main(argv=None):
    from source_code.cli import Parser, positive_int
    from source_code.distributed import print0, session
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=positive_int, default=359, help="held-out digits evaluated (at most 360)")
    p.add_argument("--epochs", type=positive_int, default=1)
    args = p.parse_args(argv)
    if args.samples > 360:
        p.error("--samples must be at most 360 (the held-out digits)")
    with session(launch_hint="torchrun --standalone --nproc-per-node=3 -m source_code.training.evaluation"):
        r = compare(args.samples, args.epochs)
        print0(f"rank 0 alone: {r['reference']:.6f} over {r['samples']} samples")
        print0(f"sharded, sum then divide: {r['sharded']:.6f}")
        print0(f"mean of the ranks' accuracies: {r['mean_of_ranks']:.6f}")
        print0(f"DistributedSampler, padded: {r['padded']:.6f} over {r['padded_samples']} samples")
        print0(f"DistributedSampler, drop_last: {r['dropped']:.6f} over {r['dropped_samples']} samples")
        print0(f"summary: world_size={r['world_size']} device={r['device']} samples={r['samples']} "
               f"sharded_error={abs(r['sharded'] - r['reference']):.1e} "
               f"mean_of_ranks_error={abs(r['mean_of_ranks'] - r['reference']):.1e}")
    return 0


if __name__ == "__main__":
    from source_code.errors import run_main
    run_main(main)
