"""ZeRO-1 and ZeRO-2 with gradient accumulation: where the reduce-scatter goes decides the memory.

    python -m source_code.planner.check      # counts their bytes against the planner's
    python -m source_code.planner.timing     # times them against the planner's step model

A step of m micro-batches accumulates m gradients before the optimizer steps. The two stages
differ in when the gradients leave a rank, and that fixes both what it holds and what it sends:

    stage   gradients held meanwhile   reduce-scatters per step   all-gathers of the parameters
    1       P (the full gradient)      1, after the last micro-batch          1
    2       P / N (its chunks)         m, one after every micro-batch         1

ZeRO-2 cannot wait: it keeps only its chunks, so the rest of each micro-batch's gradient must
go to its owners before the next backward adds to it (DeepSpeed's ZeRO-2 does this). The
chunks, the AdamW on them and the padding are those of ``sharding.zero.ZeroAdamW``; what is new
is that gradients travel in buckets, as DDP and DeepSpeed send them: the tensors of a bucket
(consecutive parameters, up to ``bucket_numel`` elements) go in one reduce-scatter as soon as
the last of them has its gradient, so a step makes a few large calls, not one per tensor
(ZeRO-2's transient is one bucket of full gradients):

    bucket flat  (N, c_a + c_b + ...)   row r = rank r's chunk of every tensor of the bucket

    opt = AccumulatingZero(model, stage=2, lr=1e-3)
    for x, y in micro_batches:
        lm_loss(model(x), y, n_valid).backward()  # stage 2: the buckets reduce-scatter here
    opt.step()                                    # stage 1: they reduce-scatter here, once
    opt.zero_grad()
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from source_code.sharding import comm
from source_code.sharding.zero import ZeroAdamW


class AccumulatingZero(ZeroAdamW):
    """ZeroAdamW for several backward passes per step (``stage`` 1 or 2), bucketed collectives."""

    def __init__(self, model: nn.Module, stage: int = 1, bucket_numel: int = 2 ** 20, **adamw_kwargs):
        super().__init__(model, stage=1, **adamw_kwargs)     # chunks and AdamW; no per-tensor hooks
        self.stage = stage
        if stage not in (1, 2):
            raise ValueError(f"stage must be 1 or 2, not {stage}")
        self.buckets, size = [[]], 0
        for i, p in enumerate(self.params):
            if self.buckets[-1] and size + p.numel() > bucket_numel:
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(i)
            size += p.numel()
        self.waiting = [len(b) for b in self.buckets]
        if stage == 2:
            for b, bucket in enumerate(self.buckets):
                for i in bucket:
                    self.params[i].register_post_accumulate_grad_hook(self._ready(b))

    def _ready(self, b: int):
        def hook(p: torch.Tensor) -> None:
            self.waiting[b] -= 1
            if self.waiting[b] == 0:                      # the bucket's last gradient is in
                self.waiting[b] = len(self.buckets[b])
                self._reduce_scatter(b, keep_full=False)
        return hook

    def _columns(self, b: int) -> list[int]:
        return [comm.chunk_size(self.params[i].numel(), self.world) for i in self.buckets[b]]

    @torch.no_grad()
    def _reduce_scatter(self, b: int, keep_full: bool) -> None:
        """One reduce-scatter of bucket b; each chunk is added to its shard's gradient.

        keep_full (ZeRO-1): the chunk is written back into the full gradient's own elements,
        which stay allocated; otherwise (ZeRO-2) the full gradients are freed."""
        params = [self.params[i] for i in self.buckets[b]]
        flat = torch.cat([comm.padded(p.grad.reshape(-1), self.world).view(self.world, -1)
                          for p in params], dim=1)        # (N, sum c)
        mine = flat.new_empty(flat.shape[1])              # (sum c,) this rank's row
        dist.reduce_scatter_tensor(mine, flat.reshape(-1), op=dist.ReduceOp.SUM)
        mine.div_(self.world)
        for p, i, part in zip(params, self.buckets[b], mine.split(self._columns(b))):
            shard = self.shards[i]
            lo, hi = comm.owned_range(p.numel(), self.world, self.rank)
            if keep_full:
                shard.grad = p.grad.view(-1)[lo:hi].copy_(part[: hi - lo])   # a view: P held
            else:
                shard.grad = part[: hi - lo].clone() if shard.grad is None else shard.grad.add_(part[: hi - lo])
                p.grad = None

    @torch.no_grad()
    def _all_gather(self, b: int) -> None:
        """One all-gather of bucket b's updated chunks into the full parameters."""
        params = [self.params[i] for i in self.buckets[b]]
        cols = self._columns(b)
        send = torch.cat([torch.cat([self.shards[i].detach(),
                                     self.shards[i].new_zeros(c - self.shards[i].numel())])
                          for i, c in zip(self.buckets[b], cols)])           # (sum c,)
        gathered = send.new_empty(self.world * send.numel())                 # (N * sum c,)
        dist.all_gather_into_tensor(gathered, send)
        for p, part in zip(params, gathered.view(self.world, -1).split(cols, dim=1)):
            p.data.view(-1).copy_(part.reshape(-1)[: p.numel()])            # (N, c) -> (n,)

    @torch.no_grad()
    def step(self) -> None:
        if self.stage == 1:
            for b in range(len(self.buckets)):
                self._reduce_scatter(b, keep_full=True)
        self.inner.step()
        for b in range(len(self.buckets)):
            self._all_gather(b)
