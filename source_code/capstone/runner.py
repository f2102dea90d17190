"""What every configuration of the capstone provides, and the helpers they share.

A ``Runner`` trains one configuration on this rank:

* ``step(x, y, count)``: one training step on the global batch (x, y) whose valid targets
  number ``count`` (every configuration cuts out its own part); returns the global loss on
  the ranks that know it, None elsewhere;
* ``weights()``: name -> full tensor for every parameter this rank holds (collective for
  sharded ones: every rank of the configuration calls it);
* ``kind``: which seed model and reference it is compared with ("dense" or "moe").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from source_code.measure import DTensor


@dataclass
class Runner:
    step: Callable
    weights: Callable
    kind: str = "dense"


def full_weights(model) -> dict:
    """name -> full tensor (DTensors gathered: a collective on every rank of their mesh)."""
    return {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
            for n, p in model.named_parameters()}


def sum_gradients(params, group=None) -> None:
    """Add up each gradient over ``group`` (the loss already carries 1/global count)."""
    for p in params:
        if p.grad is not None:
            dist.all_reduce(p.grad, group=group)


def report(loss: torch.Tensor, group=None) -> float:
    """The global loss from this rank's share of it: a SUM over ``group``."""
    total = loss.detach().clone().reshape(1)
    dist.all_reduce(total, group=group)
    return total.item()


def piece(batch, index: int, n: int):
    """Piece ``index`` of ``n`` consecutive pieces of the global batch (a data-parallel slice)."""
    x, y = batch
    return x.chunk(n)[index], y.chunk(n)[index]
