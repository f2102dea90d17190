"""Reference solution of notebook 18's exercise: DiLoCo's outer step."""
from __future__ import annotations

import torch


@torch.no_grad()
def outer_step(global_params, local_params, outer_opt, average):
    deltas = [g - p for g, p in zip(global_params, local_params)]   # the pseudo-gradient
    average(deltas)                                                   # one all-reduce
    for g, d in zip(global_params, deltas):
        g.grad = d
    outer_opt.step()                                                  # Nesterov SGD
    for p, g in zip(local_params, global_params):
        p.copy_(g)                                                    # every worker restarts here
