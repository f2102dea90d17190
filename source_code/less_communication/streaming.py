"""Streaming DiLoCo (Douillard et al., 2025): the model synchronised a fragment at a time.

The parameters are cut into F fragments of about equal size (consecutive layers). Every
fragment still synchronises once per H steps, but fragment f does it at steps
f H/F, f H/F + H, ...: the F synchronisations of a round are spread over the round, so one
synchronisation carries 1/F of the model (the peak bandwidth a link must offer falls F times)
while the bytes per step stay those of DiLoCo. Each fragment has its own outer optimizer.
``average`` may send fewer bits (``local_sgd.average_fp16``: half the bytes again).
"""
from __future__ import annotations

import torch

from source_code.less_communication.local_sgd import average, outer_step


def fragments(params, n: int) -> list:
    """Consecutive parameters cut into ``n`` groups of about equal numel (none empty)."""
    params = list(params)
    if not 1 <= n <= len(params):
        raise ValueError(f"need 1 <= fragments <= {len(params)} parameters, got {n}")
    total = sum(p.numel() for p in params)
    groups, current, done = [], [], 0
    for i, p in enumerate(params):
        current.append(p)
        done += p.numel()
        left_groups, left_params = n - len(groups) - 1, len(params) - i - 1
        if left_groups and (done >= total * (len(groups) + 1) / n or left_params == left_groups):
            groups.append(current)
            current = []
    groups.append(current)
    return groups


class StreamingDiLoCo:
    def __init__(self, params, every: int, n_fragments: int, outer_lr: float = 0.7,
                 outer_momentum: float = 0.9, average=average):
        if every % n_fragments:
            raise ValueError(f"H={every} must be a multiple of the {n_fragments} fragments")
        self.frags = fragments(params, n_fragments)
        self.every, self.average = every, average
        self.offsets = [f * every // n_fragments for f in range(n_fragments)]
        self.global_params = [[p.detach().clone() for p in frag] for frag in self.frags]
        self.outers = [torch.optim.SGD(g, lr=outer_lr, momentum=outer_momentum, nesterov=True)
                       for g in self.global_params]

    def after_inner_step(self, step: int) -> bool:
        synced = False
        for frag, glob, outer, offset in zip(self.frags, self.global_params, self.outers, self.offsets):
            if (step + 1 - offset) % self.every == 0 and step + 1 >= offset:
                outer_step(glob, frag, outer, self.average)
                synced = True
        return synced
