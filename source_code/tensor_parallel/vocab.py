"""Vocabulary-parallel embedding and cross-entropy: no rank holds a full (vocab, d) table or the
full (b, t, vocab) logits (with 50k-250k tokens, these are the largest tensors of a model).

* ``VocabParallelEmbedding``: rank r keeps the rows of tokens [r*V/n, (r+1)*V/n). It looks up
  the tokens it owns, writes zeros for the others, and the sum over the ranks (an all-reduce,
  or a reduce-scatter with sequence parallelism) is the full embedding.
* The head is a column-parallel linear: rank r computes the logits of its V/n tokens.
* ``vocab_parallel_cross_entropy``: softmax over a vocabulary split across ranks needs three
  small all-reduces of (b, t) numbers: the max (for stability), the sum of exponentials, and
  the logit of the target (only its owner has it). Backward needs none: softmax - one-hot,
  each rank on its own columns.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from source_code.tensor_parallel import comm
from source_code.tensor_parallel.layers import shard_range


class VocabParallelEmbedding(nn.Module):
    def __init__(self, dense: nn.Embedding, rank: int, world: int, sequence_parallel: bool = False):
        super().__init__()
        self.lo, self.hi = shard_range(dense.num_embeddings, rank, world)
        self.weight = nn.Parameter(dense.weight.detach()[self.lo:self.hi].clone())   # (V/n, d)
        self.weight.owner = ("rows", self.lo, self.hi)
        self.sequence_parallel = sequence_parallel

    def forward(self, tokens):                                # (b, t), the same on every rank
        mine = (tokens >= self.lo) & (tokens < self.hi)
        local = torch.where(mine, tokens - self.lo, 0)
        x = F.embedding(local, self.weight) * mine.unsqueeze(-1)   # (b, t, d): zeros where not mine
        if self.sequence_parallel:
            return comm.reduce_scatter_to_sp(x, "embed")    # (b, t/n, d)
        return comm.reduce_from_tp(x, "embed")              # (b, t, d)


class _VocabParallelCE(torch.autograd.Function):
    """Per-token cross-entropy from logits split over the vocabulary (last dim)."""

    @staticmethod
    def forward(ctx, logits, targets, lo):                   # logits (b, t, V/n), targets (b, t)
        logits = logits.float()
        top = comm.all_reduce(logits.max(-1).values, "forward", "head.ce-max", op=dist.ReduceOp.MAX)
        shifted = logits - top.unsqueeze(-1)                 # <= 0 on every rank
        exp = shifted.exp()
        total = comm.all_reduce(exp.sum(-1), "forward", "head.ce-sum")           # (b, t)
        mine = (targets >= lo) & (targets < lo + logits.shape[-1])
        idx = torch.where(mine, targets - lo, 0).unsqueeze(-1)
        target_logit = torch.where(mine, shifted.gather(-1, idx).squeeze(-1), 0.0)
        target_logit = comm.all_reduce(target_logit, "forward", "head.ce-target")  # only its owner adds
        ctx.save_for_backward(exp / total.unsqueeze(-1), mine, idx)
        return total.log() - target_logit                    # (b, t)

    @staticmethod
    def backward(ctx, grad):                                 # no communication
        softmax, mine, idx = ctx.saved_tensors
        g = softmax.clone()
        g.scatter_add_(-1, idx, -mine.unsqueeze(-1).to(g.dtype))   # softmax - one-hot, my columns
        return g * grad.unsqueeze(-1), None, None


def vocab_parallel_cross_entropy(logits_local, targets, lo: int, ignore_index: int = -100):
    """Mean cross-entropy over the tokens whose target is not ``ignore_index``."""
    keep = targets != ignore_index
    per_token = _VocabParallelCE.apply(logits_local, torch.where(keep, targets, -1), lo)
    return (per_token * keep).sum() / keep.sum()
