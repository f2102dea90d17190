"""Which ranks sum an expert's gradient when expert parallelism takes its ranks from the others.

This course gives ep a mesh dimension of its own (the EP x DP row's (dp, ep) mesh). torchtitan
does not: its ``parallel_dims.py`` (since pytorch/torchtitan#3167, April 2026, which deprecated
expert tensor parallelism) unflattens the same world twice, row-major:

    dense   ("pp", "dp_replicate", "dp_shard", "cp", "tp")
    sparse  ("pp", "dp_replicate", "efsdp", "ep")      efsdp = dp_shard * cp * tp // ep

and otherwise raises "expert_parallel_degree ({ep}) must divide dp_shard * cp * tp (...)".
An expert's weights are sharded over "ep" and FSDP-wrapped over "efsdp" (replicated over
"dp_replicate"), so its gradient is reduced over ("dp_replicate", "efsdp"): every rank of its
pipeline stage that holds the same experts. In the MoE layer the tp ranks split the tokens too (``moe_sharding.py``: MoE
"reuses the mesh axis named TP for sequence-token sharding"), so every rank of that group routed
other tokens. ``check`` shows it on one process by counting tokens (its model is that every rank
of the region routes tokens of its own): each rank's expert gradient after the reduction must
equal one process's, whose every token reaches its expert once. The dp x cp rule (``dp_cp_rule``)
is enough only where tp divides ep.

    from source_code.capstone import expert_groups
    expert_groups.check(expert_groups.expert_grad_group, dp_shard=2, tp=4, ep=2)   # 0
"""
from __future__ import annotations

import torch

AXES = ("pp", "dp_replicate", "dp_shard", "cp", "tp", "ep")
EXPERTS_PER_RANK = 2
TOKENS_PER_RANK = 6


def layouts(pp=1, dp_replicate=1, dp_shard=1, cp=1, tp=1, ep=1) -> dict:
    """The world's ranks as torchtitan's two meshes lay them out (``_unflatten``: row-major)."""
    region = dp_shard * cp * tp
    if region % ep:
        raise ValueError(f"ep={ep} must divide dp_shard * cp * tp = {region} (torchtitan's rule)")
    world = torch.arange(pp * dp_replicate * region)
    return {"dense": world.view(pp, dp_replicate, dp_shard, cp, tp),
            "sparse": world.view(pp, dp_replicate, region // ep, ep)}


def _where(layout: torch.Tensor, rank: int) -> tuple:
    return tuple(int(i) for i in (layout == rank).nonzero()[0])


def ep_group(rank: int, **sizes) -> list[int]:
    """The ranks that exchange tokens with ``rank`` in the all-to-all (its "ep" axis)."""
    sparse = layouts(**sizes)["sparse"]
    p, r, f, _ = _where(sparse, rank)
    return sparse[p, r, f, :].tolist()


def expert_grad_group(rank: int, **sizes) -> list[int]:
    """torchtitan's group for an expert's gradient: ("dp_replicate", "efsdp") of the sparse mesh."""
    sparse = layouts(**sizes)["sparse"]
    p, _, _, e = _where(sparse, rank)
    return sorted(sparse[p, :, :, e].flatten().tolist())


def dp_cp_rule(rank: int, **sizes) -> list[int]:
    """The rule "the ranks of dp x cp outside the expert's ep group" (right only where ep is
    taken from dp x cp alone): this rank's dp x cp ranks that hold the same experts."""
    lay = layouts(**sizes)
    p, _, _, _, t = _where(lay["dense"], rank)
    same = set(expert_grad_group(rank, **sizes))
    return sorted(q for q in lay["dense"][p, :, :, :, t].flatten().tolist() if q in same)


def check(group_fn, seed: int = 0, **sizes) -> int:
    """Largest |expert gradient after summing over ``group_fn(rank)`` - one process's|.

    Every rank of a stage's EP region holds its own tokens in the MoE layer (dp and cp: other
    samples and positions; tp: other tokens of them), each with an integer feature and a routed
    expert. A rank's local gradient of expert e is the sum of the features its ep group sent to e;
    one process's is the sum over every token routed to e. Integers: exact, so 0 means right.
    """
    lay = layouts(**sizes)
    ep, world = lay["sparse"].shape[-1], lay["sparse"].numel()
    n_experts = EXPERTS_PER_RANK * ep
    gen = torch.Generator().manual_seed(seed)
    per_stage = world // lay["sparse"].shape[0]
    feature = torch.randint(1, 100, (per_stage, TOKENS_PER_RANK), generator=gen)
    expert = torch.randint(0, n_experts, (per_stage, TOKENS_PER_RANK), generator=gen)
    one_process = torch.zeros(n_experts, dtype=torch.long).index_add_(0, expert.flatten(), feature.flatten())
    local = torch.zeros(world, n_experts, dtype=torch.long)        # rank -> its experts' gradients
    for rank in range(world):
        e_rank = _where(lay["sparse"], rank)[-1]
        mine = range(e_rank * EXPERTS_PER_RANK, (e_rank + 1) * EXPERTS_PER_RANK)
        for src in ep_group(rank, **sizes):                          # the all-to-all brings these
            k = src % per_stage                                      # the same tokens on every stage
            for f, e in zip(feature[k].tolist(), expert[k].tolist()):
                if e in mine:
                    local[rank, e] += f
    worst = 0
    for rank in range(world):
        e_rank = _where(lay["sparse"], rank)[-1]
        mine = slice(e_rank * EXPERTS_PER_RANK, (e_rank + 1) * EXPERTS_PER_RANK)
        reduced = local[group_fn(rank, **sizes)].sum(0)
        worst = max(worst, int((reduced[mine] - one_process[mine]).abs().max()))
    return worst
