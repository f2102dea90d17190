"""Local SGD and DiLoCo by hand: H steps alone, then one synchronisation.

Every worker trains its own copy with its own inner optimizer (AdamW) on its own batches.
Every H steps:

    local SGD   params = average over workers of params                  (one all-reduce)
    DiLoCo      the workers' averaged pseudo-gradient (one all-reduce) goes to an outer
                optimizer (SGD, Nesterov momentum 0.9, lr 0.7: Douillard et al., 2023) that
                holds the parameters of the last synchronisation (notebook 18's exercise)

``global`` is the parameters of the last synchronisation, kept on every worker (a second copy
of the model, no optimizer state of its own besides the outer momentum). Local SGD is DiLoCo
with an outer SGD of learning rate 1 and no momentum (the paper's ablation of the outer
optimizer compares these two, and an outer Adam). Either way the bytes of one all-reduce of the parameters
are paid once per H steps instead of every step. ``average`` may be swapped for one that sends
fewer bits (``lowbit.py``).
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def average(tensors) -> None:
    """In place: each tensor becomes its mean over the workers (one all-reduce for all)."""
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for t in tensors:
        t.copy_(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()


@torch.no_grad()
def local_sgd_sync(params, average=average) -> None:
    average(params)


@torch.no_grad()
def pseudo_gradient(global_params, params) -> torch.Tensor:
    """One flat buffer: how far the last synchronisation is from where the inner steps went."""
    return torch.cat([(g - p).reshape(-1) for g, p in zip(global_params, params)])


@torch.no_grad()
def apply_outer(global_params, params, outer, mean_delta: torch.Tensor, mix: float = 0.0) -> None:
    """The outer step on the averaged flat pseudo-gradient ``mean_delta``; then ``params``
    (a model or a fragment) keep ``mix`` of themselves and take the rest from the result."""
    offset = 0
    for g in global_params:
        g.grad = mean_delta[offset:offset + g.numel()].view_as(g)
        offset += g.numel()
    outer.step()
    for p, g in zip(params, global_params):
        if mix:
            p.mul_(mix).add_(g, alpha=1 - mix)
        else:
            p.copy_(g)


class DiLoCo:
    """Call ``after_inner_step(step)`` after each inner optimizer step (step counts from 0)."""

    def __init__(self, params, every: int, outer_lr: float = 0.7, outer_momentum: float = 0.9,
                 average=average):
        if every < 1:
            raise ValueError(f"DiLoCo synchronises every H >= 1 steps, got H={every}")
        self.params = list(params)
        self.every, self.average = every, average
        self.global_params = [p.detach().clone() for p in self.params]
        self.outer = torch.optim.SGD(self.global_params, lr=outer_lr, momentum=outer_momentum,
                                     nesterov=outer_momentum > 0)

    def after_inner_step(self, step: int) -> bool:
        if (step + 1) % self.every:
            return False
        self.synchronise()
        return True

    @torch.no_grad()
    def synchronise(self) -> None:
        delta = pseudo_gradient(self.global_params, self.params)
        self.average([delta])
        apply_outer(self.global_params, self.params, self.outer, delta)


class LocalSGD:
    def __init__(self, params, every: int, average=average):
        if every < 1:
            raise ValueError(f"local SGD synchronises every H >= 1 steps, got H={every}")
        self.params, self.every, self.average = list(params), every, average

    def after_inner_step(self, step: int) -> bool:
        if (step + 1) % self.every:
            return False
        local_sgd_sync(self.params, self.average)
        return True
