"""ZeRO stages 1 and 2 written by hand on torch.distributed collectives.

Plain data parallelism (DDP) keeps on every rank the whole model, the whole gradient and the
whole Adam state (2 numbers per parameter): 4 copies' worth of P, all identical across ranks.
ZeRO removes the duplication of the states that are only needed by the optimizer step:

* stage 1: rank r keeps the Adam state of chunk r of every parameter only; it all-reduces the
  gradients as DDP does, steps its chunks, and the updated chunks are all-gathered so every
  rank has the full new parameters for the next forward pass;
* stage 2: the gradients are reduce-scattered instead of all-reduced, as soon as each one is
  ready (a post-accumulate-grad hook), so a rank keeps only the gradient of its chunks.

The chunk bookkeeping and the collectives are in comm.py; the optimizer arithmetic is torch's
AdamW (or another torch optimizer, ``ZeroOptimizer(model, stage, torch.optim.SGD, lr=...)``),
run on this rank's chunks, so the result equals that optimizer on one process.

    torchrun --standalone --nproc-per-node=2 -m source_code.sharding.parity   # checks it
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from source_code.sharding import comm


class ZeroOptimizer:
    """A torch optimizer whose state is split across ranks:
    ``ZeroOptimizer(model, stage=1 or 2, optimizer=torch.optim.SGD, lr=..., momentum=...)``.

    Use it like an optimizer: forward, backward, ``step()``, ``zero_grad()``.
    """

    def __init__(self, model: nn.Module, stage: int = 1, optimizer=torch.optim.AdamW, **optimizer_kwargs):
        if stage not in (1, 2):
            raise ValueError(f"stage must be 1 or 2, not {stage}")
        self.stage = stage
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.shards = []
        for p in self.params:
            lo, hi = comm.owned_range(p.numel(), self.world, self.rank)
            # (hi - lo,) a view of p's own storage: updating the shard updates p, no copy kept
            self.shards.append(nn.Parameter(p.detach().view(-1)[lo:hi]))
        # the optimizer's state (AdamW's exp_avg, exp_avg_sq) is created for the shards only
        self.inner = optimizer(self.shards, **optimizer_kwargs)
        if stage == 2:
            for p, shard in zip(self.params, self.shards):
                p.register_post_accumulate_grad_hook(self._reduce_scatter_hook(shard))

    @staticmethod
    def _reduce_scatter_hook(shard: nn.Parameter):
        def hook(p: torch.Tensor) -> None:
            mine = comm.reduce_scatter_mean(p.grad)       # (c,) this rank's chunk of the mean
            shard.grad = mine[: shard.numel()]            # (hi - lo,) drop the padding
            p.grad = None                                 # the full gradient is freed at once
        return hook

    @torch.no_grad()
    def step(self) -> None:
        if self.stage == 1:
            for p, shard in zip(self.params, self.shards):
                comm.all_reduce_mean_(p.grad)             # (n,) full mean gradient, as DDP
                lo, hi = comm.owned_range(p.numel(), self.world, self.rank)
                shard.grad = p.grad.view(-1)[lo:hi]       # (hi - lo,) a view, no copy
        self.inner.step()                                 # the optimizer on this rank's chunks only
        for p, shard in zip(self.params, self.shards):
            comm.all_gather_into_(p.data, shard)          # everyone gets every updated chunk

    def zero_grad(self, set_to_none: bool = True) -> None:
        for t in self.params + self.shards:
            t.grad = None

    def state_dict(self) -> dict:
        return self.inner.state_dict()


class ZeroAdamW(ZeroOptimizer):
    """AdamW whose state is split across ranks: ``ZeroAdamW(model, stage=1 or 2, lr=...)``
    (2P/N numbers of Adam state per rank)."""

    def __init__(self, model: nn.Module, stage: int = 1, **adamw_kwargs):
        super().__init__(model, stage, torch.optim.AdamW, **adamw_kwargs)
