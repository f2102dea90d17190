"""Context parallelism on a whole training step of the TransformerLM (source_code/workload.py).

The processes form a 2-D grid, DP x CP (``mesh_groups``): the DP ranks hold different samples,
the CP ranks of one DP rank hold the same samples but different tokens of each sequence. Every
rank holds the whole model. One step on one rank:

    inputs, targets: (b, T)      this DP rank's samples; targets[:, i] is the token after
                                 inputs[:, i], shifted on the WHOLE sequence, before any split
    tokens, positions, labels = split_sequence(inputs, targets, cp_rank, cp, layout)   # (b, T/cp)
    logits = cp_logits(model, tokens, positions, attention over the CP group)          # (b, T/cp, V)
    loss = my tokens' summed cross-entropy / valid targets of the whole global batch
    loss.backward(); all-reduce (SUM) every gradient over the DP x CP ranks

Three things travel with the tokens: their **positions** (the global ones: rank r's tokens are
not at 0..T/cp-1), their **labels** (the next token of a chunk's last token lives on another
rank, so the shift comes first) and their share of the **loss** (a sum over the tokens this rank
holds, divided by the token count of the whole batch, so that the pieces add up to the mean).
The gradients: a CP rank's weights saw only its tokens, a DP rank's only its samples, and the
weights are the same on all of them, so the all-reduce runs over DP x CP; each piece is already
divided by the global count, so the reduction is a sum, not a mean.

The attention core is any family of families.py (ring, all-gather, Ulysses) on the CP group;
everything else in the model acts on each token alone (model.py's block_forward).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from source_code import workload
from source_code.context_parallel import families
from source_code.context_parallel import layout as lay
from source_code.context_parallel.model import block_forward


@dataclass
class Groups:
    """This rank's place in the DP x CP grid and the groups each reduction runs over."""
    dp_rank: int
    dp: int
    cp_rank: int
    cp: int
    cp_group: object        # the ranks that hold the other tokens of my sequences
    dp_group: object        # the ranks that hold my tokens of other samples
    dp_cp_group: object     # every rank that holds a copy of the weights


def mesh_groups(dp: int, cp: int, device_type: str = "cpu") -> Groups:
    """(dp, cp) grid over the whole job, cp varying fastest (a CP group: cp consecutive ranks)."""
    world = dist.get_world_size()
    if dp * cp != world:
        raise ValueError(f"a DP x CP grid of {dp} x {cp} needs {dp * cp} processes, this job has {world}: "
                         f"choose dp and cp whose product is {world}")
    mesh = init_device_mesh(device_type, (dp, cp), mesh_dim_names=("dp", "cp"))
    return Groups(mesh.get_local_rank("dp"), dp, mesh.get_local_rank("cp"), cp,
                  mesh.get_group("cp"), mesh.get_group("dp"), None)     # None: the whole job


def split_sequence(inputs, targets, cp_rank: int, cp: int, layout: str = "zigzag"):
    """This rank's tokens, their global positions and their next-token targets: (b, T/cp) each,
    positions (T/cp,). The targets were shifted on the whole sequence; one index cuts both."""
    positions = lay.token_index(inputs.shape[1], cp_rank, cp, layout).to(inputs.device)
    return inputs[:, positions], positions, targets[:, positions]


def cp_logits(model, tokens, positions, core):
    """TransformerLM.forward on this rank's tokens: embeddings at their global positions, every
    block with ``core`` as its attention (over the CP group). (b, T/cp) -> (b, T/cp, vocab)."""
    x = model.tok(tokens) + model.pos(positions)                      # (b, T/cp, dim)
    for block in model.layers:
        x = block_forward(block, x, core)
    return model.head(model.norm(x))


def global_token_loss(logits, labels, group):
    """This rank's summed cross-entropy / the valid targets of every rank in ``group``."""
    n_valid = (labels != -100).sum()
    dist.all_reduce(n_valid, group=group)                             # the global batch's count
    return workload.lm_loss(logits, labels, n_valid)


def reduce_gradients(model, group) -> None:
    """Sum every gradient over ``group``: each rank's is its tokens' part of the global mean.
    One flat message for all of them, as DDP's buckets do (one all-reduce per tensor costs a
    latency each)."""
    grads = [p.grad for p in model.parameters()]
    flat = torch.cat([g.flatten() for g in grads])
    dist.all_reduce(flat, group=group)
    for g, summed in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(summed.view_as(g))


def train_step(model, inputs, targets, g: Groups, family: str = "ring", layout: str = "zigzag"):
    """Forward and backward of one step on this rank's tokens of its samples; the gradients
    summed over DP x CP. Returns the global batch's mean loss (the same on every rank)."""
    tokens, positions, labels = split_sequence(inputs, targets, g.cp_rank, g.cp, layout)
    core = functools.partial(families.attention, family, causal=True, layout=layout, group=g.cp_group)
    loss = global_token_loss(cp_logits(model, tokens, positions, core), labels, g.dp_cp_group)
    loss.backward()
    reduce_gradients(model, g.dp_cp_group)
    total = loss.detach().clone()
    dist.all_reduce(total, group=g.dp_cp_group)                       # the pieces add up to the mean
    return total
