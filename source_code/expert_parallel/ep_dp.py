"""Expert x data parallelism on a device mesh: who reduces which gradient with whom.

A mesh (dp, ep) of dp * ep ranks; the last dimension varies fastest, so the ranks of one "ep"
group are consecutive (one node under torchrun/Slurm: the all-to-all of every MoE layer is
the most frequent, latency-bound traffic and stays on the fast links)::

    init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "ep"))
    mesh.mesh = [[0, 1],     a row: one "ep" group, the E experts split over its ranks
                 [2, 3]]     a column: one "dp" group, its ranks hold the SAME experts

Every rank trains on its own tokens (a dp * ep-th of the global batch). Gradients:

* dense parameters (embeddings, attention, norms, routers, shared experts, head): every rank
  has a copy and its gradient covers its own tokens: all-reduce over ALL ranks;
* expert parameters: the all-to-all brought each expert the tokens of its whole ep group, so
  its gradient already covers that group's tokens; the other copies of the same expert sit
  in the dp group: all-reduce over "dp" only. Reducing them over all ranks would add
  gradients of *different* experts.

Each rank's loss is the mean over its own tokens; the sums are divided by the number of
ranks, so a step equals one process on the global batch (``harness`` checks it).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh

from source_code.expert_parallel.ep_layer import EPMoE
from source_code.expert_parallel.moe import MoE


def make_mesh(device_type: str, dp: int, ep: int):
    """A (dp, ep) mesh over the job's dp * ep ranks."""
    return init_device_mesh(device_type, (dp, ep), mesh_dim_names=("dp", "ep"))


def to_expert_parallel(model: nn.Module, ep_group=None) -> nn.Module:
    """Swap every ``MoE`` of ``model`` (in place) for this rank's ``EPMoE`` over ``ep_group``."""
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, MoE):
                setattr(module, child_name, EPMoE(child, ep_group))
    return model


def is_expert(name: str) -> bool:
    return ".experts." in name or name.startswith("experts.")


def reduce_gradients(model: nn.Module, dp_group=None, world_group=None) -> dict:
    """Sum expert gradients over ``dp_group``, all others over ``world_group``; divide all by
    the world size (each rank's loss is a mean over its own tokens). Returns how many
    tensors went to each group."""
    world = dist.get_world_size(world_group)
    counts = {"expert (dp group)": 0, "dense (all ranks)": 0}
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        if is_expert(name):
            if dp_group is not None and dist.get_world_size(dp_group) > 1:
                dist.all_reduce(p.grad, group=dp_group)
            counts["expert (dp group)"] += 1
        else:
            dist.all_reduce(p.grad, group=world_group)
            counts["dense (all ranks)"] += 1
        p.grad.div_(world)
    return counts
