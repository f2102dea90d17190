"""What the uneven-data fixes did to the weights, checked from outside the loops.

* ``spread(tensors)``: the largest difference between the ranks' copies of some tensors (0 when
  every rank holds the same), run on every rank of a group;
* ``optimizer_state(optimizer)``: the optimizer's state as one flat tensor, and its step count;
* ``one_process(samples, per_rank, world, ...)``: the same epoch trained by one process on the
  same global batches (step k: the batches of every rank that had a k-th one), each rank's batch
  mean weighed 1 / ``world`` (Join's ``divide_by_initial_world_size=True``) or 1 / (ranks still
  in) (``False``), pads with weight 0 or counted as samples; its parameters as one flat array.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from source_code.data_at_scale import model as mdl
from source_code.data_at_scale.cursor import PAD

SEED, DIM, LAYERS, LR = 0, 16, 1, 3e-3     # the drills' model and optimizer (drills._ddp)


def build(seed: int = SEED):
    model = mdl.build(dim=DIM, layers=LAYERS, seed=seed)
    return model, torch.optim.AdamW(model.parameters(), lr=LR)


def flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().float().reshape(-1).cpu() for t in tensors])


def spread(tensors) -> float:
    """max |this rank's - any rank's| over the tensors, the same number on every rank."""
    mine = flat(tensors)
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return max(float((other - mine).abs().max()) for other in every)


def optimizer_state(optimizer) -> tuple[list[torch.Tensor], int]:
    """(every state tensor of every parameter, the step count of the first parameter)."""
    states = [optimizer.state[p] for group in optimizer.param_groups for p in group["params"]]
    tensors = [t for s in states for _, t in sorted(s.items()) if torch.is_tensor(t)]
    return tensors, int(states[0]["step"]) if states and "step" in states[0] else 0


def one_process(samples: np.ndarray, per_rank: list[list[list[int]]], world: int,
                divide_by_initial_world: bool = True, pads_weigh_zero: bool = True,
                seed: int = SEED) -> np.ndarray:
    """The parameters after the same global batches trained by one process (see the module's doc)."""
    model, opt = build(seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)                # a tiny model: one thread, as each rank has
    try:
        for k in range(max(map(len, per_rank))):
            active = [batches[k] for batches in per_rank if k < len(batches)]
            if not pads_weigh_zero:
                active = [[0 if i == PAD else i for i in ids] for ids in active]
            ranks_in = world if divide_by_initial_world else len(active)
            x, y, w = mdl.collate(samples, [i for ids in active for i in ids])
            # each rank's batch mean (over its real samples), the ranks' means summed / ranks_in
            w = w / torch.cat([torch.full((len(ids),), max(sum(i != PAD for i in ids), 1) * ranks_in)
                               for ids in active])
            loss = mdl.weighted_loss(model, x, y, w, per=1.0)
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        torch.set_num_threads(threads)
    return flat(model.parameters()).numpy()
