"""A naive DDP: copy the weights from rank 0 once, then average every gradient after backward().

    model = NaiveDDP(net)           # every rank now holds rank 0's weights
    loss_fn(model(x), y).backward() # at its end: one all_reduce per parameter tensor
    optimizer.step()                # identical gradients -> identical steps on every rank

The same training loop as with torch's DDP: a hook on every parameter runs when its gradient
is final, and the hook that sees the last one of the step (backward() is then in effect over)
averages all gradients.

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


def check_step_finished(ready: int, total: int) -> None:
    """Before a forward: the previous backward() must have given every parameter a gradient.

    Otherwise the all-reduce of the step never ran and the ranks' weights drift apart silently;
    torch's DDP stops with an error at this point too."""
    if ready:
        raise RuntimeError(f"the previous backward() gave {total - ready} of {total} parameters "
                           "no gradient, so their all-reduce never ran; give every parameter a "
                           "path to the loss (torch's DDP: find_unused_parameters=True)")


class NaiveDDP(nn.Module):
    """Wrap ``module`` and train as with torch's DDP: ``loss.backward(); optimizer.step()``."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        broadcast_parameters(module)
        self.collectives = 0  # all_reduce calls issued so far (for the comparison table)
        self._params = [p for p in module.parameters() if p.requires_grad]
        self._ready = 0  # gradients final so far in this backward()
        self._handles = [p.register_post_accumulate_grad_hook(self._on_grad_ready) for p in self._params]

    def forward(self, *args, **kwargs):
        check_step_finished(self._ready, len(self._params))
        return self.module(*args, **kwargs)

    @torch.no_grad()
    def _on_grad_ready(self, param: torch.Tensor) -> None:
        self._ready += 1
        if self._ready == len(self._params):  # the last gradient of this backward()
            self._ready = 0
            average_gradients(self.module)
            self.collectives += len(self._params)
