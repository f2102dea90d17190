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
times the context-parallel group when the sequence is split (a sequence of groups is reduced
over each in turn: their product); tensor- and pipeline-parallel ranks hold the same tokens.
Here the count is known before the first backward (every microbatch of the step is fetched
first, as torchtitan's train_step does), so each backward already carries 1/count and the
gradients have their normal size. That is a choice, not a requirement: Megatron-LM's
per-token loss backpropagates each microbatch's SUMMED loss and divides the gradients by the
all-reduced count afterwards. What must hold is that the division comes before gradient
clipping and the optimizer step. The count is clamped to at least 1 (a step with no valid
target gives a zero loss, not a division by zero).
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
    all ranks; a list of groups: their product). Once per step, all microbatches fetched."""
    n = local_token_count(pieces)            # my samples, my tokens, all my microbatches
    for g in group if isinstance(group, (list, tuple)) else (group,):
        dist.all_reduce(n, group=g)          # + those of the ranks holding other tokens
    return n.clamp(min=1)


def global_token_loss(logits, targets, count) -> torch.Tensor:
    """Summed cross-entropy of this piece / the step's global ``count`` of valid targets."""
    loss_sum = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE,
                               reduction="sum")
    return loss_sum / count


class StepLoss:
    """A loss function fixed when a schedule is built (torch's pipeline schedules take one),
    dividing by the count of the step it runs: set ``count`` before each step."""
    count = None

    def __call__(self, logits, targets) -> torch.Tensor:
        return global_token_loss(logits, targets, self.count)


def mean_loss(logits, targets) -> torch.Tensor:
    """The per-piece mean (cross_entropy's default): what the naive code computes."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE)
