"""Reference solutions for the exercises of notebook 05 (DDP), checked by tests/test_solutions_05.py.

    python -m pytest tests/test_solutions_05.py
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def shard(n, world_size, rank, epoch, seed):
    """(a) The indices DistributedSampler(shuffle=True) gives ``rank`` in ``epoch``."""
    g = torch.Generator()
    g.manual_seed(seed + epoch)                       # same shuffle on every rank
    order = torch.randperm(n, generator=g).tolist()
    total = ((n + world_size - 1) // world_size) * world_size
    while len(order) < total:                         # pad by repeating the start
        order += order[: total - len(order)]
    return order[rank:total:world_size]               # every world_size-th, from rank


def average_gradients(model):
    """(b) Replace every gradient by its mean over all ranks."""
    world_size = dist.get_world_size()
    for p in model.parameters():
        if p.grad is not None:
            p.grad /= world_size                      # divide first, as DDP does
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)  # then the sum is the mean
