"""A naive DDP: copy the weights from rank 0 once, then average every gradient after backward().

    model = NaiveDDP(net)           # every rank now holds rank 0's weights
    loss_fn(model(x), y).backward()
    model.sync_gradients()          # one all_reduce per parameter, after backward() finished
    optimizer.step()                # identical gradients -> identical steps on every rank

Correct but slow: one collective per parameter tensor (many small messages, each paying the
latency), and none of them starts before the whole backward pass is over, so the network idles
while the processor computes and the other way round. bucketed.py fixes both.
Used by compare.py (``torchrun --standalone --nproc-per-node=2 -m source_code.ddp_internals.compare``).
"""
from __future__ import annotations

import itertools

import torch
import torch.distributed as dist
from torch import nn


def broadcast_parameters(module: nn.Module, src: int = 0) -> None:
    """Make every rank's parameters and buffers equal to those of rank ``src``."""
    for t in itertools.chain(module.parameters(), module.buffers()):
        dist.broadcast(t.data, src=src)


def average_gradients(module: nn.Module) -> None:
    """Replace every gradient by its mean over the ranks: divide by the world size, then SUM.

    Divide first, as torch's DDP and bucketed.py do: the sum of the divided gradients is the
    mean, and the values that travel stay as small as the gradients themselves (a sum of many
    large fp16 gradients could overflow before a division after it). SUM works on every backend
    and version (ReduceOp.AVG is missing on gloo in older torch).
    """
    world = dist.get_world_size()
    for p in module.parameters():
        if p.grad is not None:
            p.grad.div_(world)
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)


class NaiveDDP(nn.Module):
    """Wrap ``module``; call ``sync_gradients()`` between backward() and optimizer.step()."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        broadcast_parameters(module)
        self.collectives = 0  # all_reduce calls issued so far (for the comparison table)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @torch.no_grad()
    def sync_gradients(self) -> None:
        average_gradients(self.module)
        self.collectives += sum(p.grad is not None for p in self.module.parameters())
