"""Data-parallel configurations: every rank holds the model (or a shard of it), its own samples.

* "one process, 4 pieces": the reference's arithmetic on 4 consecutive slices accumulated;
* "DDP": torch's DistributedDataParallel; "DDP by hand": ddp_internals.NaiveDDP (notebook 05);
* "DDP, sum in rank order": the gradients all-gathered and added in rank order, as the
  accumulation above adds them: the same numbers in the same order give the same bits;
* "ZeRO-1", "ZeRO-2": sharding.zero (notebook 09) with its sharded state being SGD's momentum;
* "FSDP2": sharding.fsdp.shard_model on a 1-D mesh.

Each rank's loss is its summed cross-entropy / the GLOBAL number of valid targets (lm_loss).
The wrappers average gradients over the ranks; the loss is multiplied by the number of ranks
to undo that average, so the gradients ADD UP to the one-process gradient.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.parallel import DistributedDataParallel as DDP

from source_code.capstone import seed
from source_code.capstone.runner import Runner, full_weights, piece, report
from source_code.ddp_internals.naive import NaiveDDP
from source_code.mesh.reference import make_optimizer
from source_code.sharding.fsdp import shard_model
from source_code.sharding.zero import ZeroAdamW
from source_code.workload import lm_loss


class ZeroSGD(ZeroAdamW):
    """ZeRO-1/2 by hand (sharding/zero.py) whose sharded optimizer is SGD with momentum, the
    optimizer of every configuration here (Adam's division by sqrt(v) would blow float
    rounding up to the size of a step)."""

    def __init__(self, model, stage: int, lr: float):
        super().__init__(model, stage=stage, lr=lr)
        self.inner = make_optimizer(self.shards, lr)    # the momentum of this rank's chunks only


def one_process_pieces(path, lr: float, pieces: int = 4) -> Runner:
    """Rank 0 alone: the global batch as ``pieces`` slices, gradients accumulated in order."""
    model = seed.load_seed(path)
    opt = make_optimizer(model.parameters(), lr)
    is_main = dist.get_rank() == 0

    def step(x, y, count):
        if not is_main:
            return None
        total = 0.0
        for xs, ys in zip(x.chunk(pieces), y.chunk(pieces)):
            loss = lm_loss(model(xs), ys, count)
            loss.backward()
            total += loss.item()
        opt.step()
        opt.zero_grad()
        return total
    return Runner(step, lambda: full_weights(model) if is_main else {})


def data_parallel(path, lr: float, wrap: str) -> Runner:
    """torch's DDP ("ddp"), the hand-written one ("naive") or rank-ordered sums ("ordered")."""
    world, rank = dist.get_world_size(), dist.get_rank()
    plain = seed.load_seed(path)
    model = {"ddp": DDP, "naive": NaiveDDP}.get(wrap, lambda m: m)(plain)
    opt = make_optimizer(plain.parameters(), lr)

    def step(x, y, count):
        xs, ys = piece((x, y), rank, world)
        loss = lm_loss(model(xs), ys, count)
        if wrap == "ordered":
            loss.backward()
            value = ordered_sum(plain, loss)
        else:
            (loss * world).backward()        # the wrapper's average over ranks, undone
            value = report(loss)
        opt.step()
        opt.zero_grad()
        return value
    return Runner(step, lambda: full_weights(plain))


@torch.no_grad()
def ordered_sum(model, loss) -> float:
    """Every gradient := g_0 + g_1 + ... in rank order (all-gather, then add one by one)."""
    world = dist.get_world_size()
    for p in model.parameters():
        parts = [torch.empty_like(p.grad) for _ in range(world)]
        dist.all_gather(parts, p.grad)
        p.grad.copy_(parts[0])
        for part in parts[1:]:
            p.grad += part
    losses = [torch.empty(1) for _ in range(world)]
    dist.all_gather(losses, loss.detach().reshape(1))
    return sum(v.item() for v in losses)


def zero(path, lr: float, stage: int) -> Runner:
    world, rank = dist.get_world_size(), dist.get_rank()
    model = seed.load_seed(path)
    opt = ZeroSGD(model, stage, lr)

    def step(x, y, count):
        xs, ys = piece((x, y), rank, world)
        loss = lm_loss(model(xs), ys, count)
        (loss * world).backward()            # ZeRO's reduce-scatter / all-reduce take the mean
        opt.step()
        opt.zero_grad()
        return report(loss)
    return Runner(step, lambda: full_weights(model))


def fsdp(path, lr: float) -> Runner:
    world, rank = dist.get_world_size(), dist.get_rank()
    mesh = init_device_mesh("cpu", (world,))
    model = shard_model(seed.load_seed(path), mesh)
    opt = make_optimizer(model.parameters(), lr)

    def step(x, y, count):
        xs, ys = piece((x, y), rank, world)
        loss = lm_loss(model(xs), ys, count)
        (loss * world).backward()            # FSDP2 reduce-scatters the MEAN
        opt.step()
        opt.zero_grad()
        return report(loss)
    return Runner(step, lambda: full_weights(model))


def build(name: str, path, lr: float) -> Runner:
    return {"one process, 4 pieces": lambda: one_process_pieces(path, lr),
            "DDP": lambda: data_parallel(path, lr, "ddp"),
            "DDP by hand": lambda: data_parallel(path, lr, "naive"),
            "DDP, sum in rank order": lambda: data_parallel(path, lr, "ordered"),
            "ZeRO-1": lambda: zero(path, lr, 1),
            "ZeRO-2": lambda: zero(path, lr, 2),
            "FSDP2": lambda: fsdp(path, lr)}[name]()


NAMES = ("one process, 4 pieces", "DDP", "DDP by hand", "DDP, sum in rank order",
         "ZeRO-1", "ZeRO-2", "FSDP2")
