"""Data-parallel configurations: every rank holds the model (or a shard of it), its own samples.

* "one process, 4 pieces" (control): the reference's arithmetic on 4 consecutive slices
  accumulated, on rank 0 alone;
* "DDP": torch's DistributedDataParallel; "DDP by hand": ddp_internals.NaiveDDP (notebook 05);
* "DDP, sum in rank order" (control): the gradients all-gathered and added in rank order, as
  the accumulation above adds them: the same numbers in the same order give the same bits;
* "DDP + accumulation": DDP, each rank's samples in 2 microbatches (no_sync on the first);
  the count of every microbatch of every rank is known before the first backward;
* "ZeRO-1", "ZeRO-2": sharding.zero (notebook 09) with its sharded state being SGD's momentum;
* "ZeRO-3 (own FSDP)": sharding.own_fsdp.shard_by_hand (notebook 09), parameters sharded too;
* "FSDP2": sharding.fsdp.shard_model (torch's fully_shard) on a 1-D mesh.

Each rank's loss is its summed cross-entropy / the valid targets of ALL ranks' samples
(loss.global_token_count over the data-parallel group, here every rank). The wrappers average
gradients over the ranks; the loss is multiplied by the number of ranks to undo that average,
so the gradients ADD UP to the one-process gradient.
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from source_code.capstone import seed
from source_code.capstone.loss import global_token_count, global_token_loss, local_token_count
from source_code.capstone.runner import Runner, Spec, full_weights, mesh, piece, report
from source_code.ddp_internals.naive import NaiveDDP
from source_code.mesh.reference import make_optimizer
from source_code.sharding import own_fsdp
from source_code.sharding.fsdp import shard_model
from source_code.sharding.zero import ZeroOptimizer

MICRO = 2                 # microbatches per rank of "DDP + accumulation"


def one_process_pieces(spec: Spec, pieces: int = 4) -> Runner:
    """Rank 0 alone: the global batch as ``pieces`` slices, gradients accumulated in order."""
    model = seed.load_seed(spec.path, dtype=spec.dtype)
    opt = make_optimizer(model.parameters(), spec.lr)
    is_main = dist.get_rank() == 0

    def step(x, y):
        if not is_main:
            return None
        count, total = local_token_count([y]), 0.0          # one process: its count is global
        for xs, ys in zip(x.chunk(pieces), y.chunk(pieces)):
            loss = global_token_loss(model(xs), ys, count)
            loss.backward()
            total += loss.item()
        opt.step()
        opt.zero_grad()
        return total
    return Runner(step, lambda: full_weights(model) if is_main else {})


def data_parallel(spec: Spec, wrap: str) -> Runner:
    """torch's DDP ("ddp") or the hand-written one ("naive")."""
    world, rank = dist.get_world_size(), dist.get_rank()
    plain = seed.load_seed(spec.path, dtype=spec.dtype)
    model = {"ddp": DDP, "naive": NaiveDDP}[wrap](plain)
    opt = make_optimizer(plain.parameters(), spec.lr)

    def step(x, y):
        xs, ys = piece((x, y), rank, world)
        loss = global_token_loss(model(xs), ys, global_token_count([ys]))
        (loss * world).backward()            # the wrapper's average over ranks, undone
        opt.step()
        opt.zero_grad()
        return report(loss)
    return Runner(step, lambda: full_weights(plain))


def rank_ordered(spec: Spec) -> Runner:
    """Control: no wrapper; each gradient all-gathered and added in rank order (ordered_sum)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    model = seed.load_seed(spec.path, dtype=spec.dtype)
    opt = make_optimizer(model.parameters(), spec.lr)

    def step(x, y):
        xs, ys = piece((x, y), rank, world)
        loss = global_token_loss(model(xs), ys, global_token_count([ys]))
        loss.backward()
        total = ordered_sum(model, loss)
        opt.step()
        opt.zero_grad()
        return total
    return Runner(step, lambda: full_weights(model))


def ddp_accumulation(spec: Spec, micro: int = MICRO) -> Runner:
    """DDP with ``micro`` microbatches per rank: all fetched and counted before any backward."""
    world, rank = dist.get_world_size(), dist.get_rank()
    plain = seed.load_seed(spec.path, dtype=spec.dtype)
    model = DDP(plain)
    opt = make_optimizer(plain.parameters(), spec.lr)

    def step(x, y):
        xs, ys = piece((x, y), rank, world)                            # my samples
        micro_batches = list(zip(xs.chunk(micro), ys.chunk(micro)))    # all fetched first
        count = global_token_count([t for _, t in micro_batches])      # before the first backward
        total = 0.0
        for i, (xm, ym) in enumerate(micro_batches):
            last = i == micro - 1
            with model.no_sync() if not last else contextlib.nullcontext():   # all-reduce once
                loss = global_token_loss(model(xm), ym, count)
                (loss * world).backward()
            total += loss.item()
        opt.step()
        opt.zero_grad()
        return report(torch.tensor([total], dtype=torch.float64))
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
    losses = [torch.empty(1, dtype=loss.dtype) for _ in range(world)]
    dist.all_gather(losses, loss.detach().reshape(1))
    return sum(v.item() for v in losses)


def _averaging(spec: Spec, model, opt, weights) -> Runner:
    """A step for wrappers that average gradients over all ranks (ZeRO, FSDP)."""
    world, rank = dist.get_world_size(), dist.get_rank()

    def step(x, y):
        xs, ys = piece((x, y), rank, world)
        loss = global_token_loss(model(xs), ys, global_token_count([ys]))
        (loss * world).backward()            # the average over ranks, undone
        opt.step()
        opt.zero_grad()
        return report(loss)
    return Runner(step, weights)


def zero(spec: Spec, stage: int) -> Runner:
    model = seed.load_seed(spec.path, dtype=spec.dtype)
    opt = ZeroOptimizer(model, stage, make_optimizer, lr=spec.lr)   # SGD's momentum: my chunks only
    return _averaging(spec, model, opt, lambda: full_weights(model))


def own_zero3(spec: Spec) -> Runner:
    model = seed.load_seed(spec.path, dtype=spec.dtype)
    own_fsdp.shard_by_hand(model)            # every unit's parameters: 1/N on each rank
    opt = make_optimizer(model.parameters(), spec.lr)
    return _averaging(spec, model, opt, lambda: own_fsdp.full_state_dict(model))


def fsdp(spec: Spec) -> Runner:
    model = shard_model(seed.load_seed(spec.path, dtype=spec.dtype), mesh((dist.get_world_size(),), ("dp",)))
    opt = make_optimizer(model.parameters(), spec.lr)
    return _averaging(spec, model, opt, lambda: full_weights(model))


ROWS = {"one process, 4 pieces": one_process_pieces,
        "DDP": lambda s: data_parallel(s, "ddp"),
        "DDP by hand": lambda s: data_parallel(s, "naive"),
        "DDP, sum in rank order": rank_ordered,
        "DDP + accumulation": ddp_accumulation,
        "ZeRO-1": lambda s: zero(s, 1),
        "ZeRO-2": lambda s: zero(s, 2),
        "ZeRO-3 (own FSDP)": own_zero3,
        "FSDP2": fsdp}
CONTROLS = ("one process, 4 pieces", "DDP, sum in rank order")
