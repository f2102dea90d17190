"""The loss every configuration of the capstone computes: its own piece, the global token count.

A step's loss is the mean cross-entropy per valid target of the WHOLE global batch. A rank
holds a piece of that batch: some samples (data parallelism), some tokens of them (context
parallelism), some microbatches of them (accumulation, a pipeline schedule). Each piece
contributes its SUMMED cross-entropy divided by the count of the whole batch, so the pieces'
losses and gradients add up to the one-process ones, however uneven the pieces are:

    count = global_token_count(my_microbatches_targets, group)   # once, before any backward
    for x, y in my_microbatches:
        global_token_loss(model(x), y, count).backward()

``group`` is the set of ranks that hold OTHER tokens of the step: the data-parallel group,
times the context-parallel group when the sequence is split (tensor- and pipeline-parallel
ranks hold the same tokens: they are not in it). The count must be known before the first
backward, so every microbatch of the step is fetched first, as torchtitan's train_step does
(its ``local_valid_tokens`` summed over the batch mesh before the forward-backward passes).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

IGNORE = -100            # targets that are not predicted (padding, a prompt, a masked position)


def local_token_count(pieces) -> torch.Tensor:
    """Valid targets of this rank's pieces (a list of (b, t) target tensors)."""
    return sum((t != IGNORE).sum() for t in pieces)


def global_token_count(pieces, group=None) -> torch.Tensor:
    """Valid targets of this step's pieces on every rank of ``group`` (a collective; None:
    all ranks). Call it once per step, after fetching all of this rank's microbatches."""
    n = local_token_count(pieces)            # my samples, my tokens, all my microbatches
    dist.all_reduce(n, group=group)          # + those of the ranks holding other tokens
    return n


def global_token_loss(logits, targets, count) -> torch.Tensor:
    """Summed cross-entropy of this piece / the step's global ``count`` of valid targets."""
    loss_sum = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE,
                               reduction="sum")
    return loss_sum / count


def mean_loss(logits, targets) -> torch.Tensor:
    """The per-piece mean (cross_entropy's default): what the naive code computes."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE)
