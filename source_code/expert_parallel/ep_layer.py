"""The expert-parallel MoE layer: experts split across the ranks of a group, tokens sent to them.

Rank r of n holds experts r*E/n ... (r+1)*E/n - 1 (contiguous blocks) and a copy of the router.
Each rank routes its own tokens, then (the key lines of ``EPMoE.forward``):

    1. sort the kept assignments by expert     -> rows for rank 0's experts first, then rank 1's, ...
    2. counts first: all-to-all of the E counts -> what every rank will send me, per expert
    3. payload: all-to-all of the rows          -> (rows for my experts, d), by source rank, then expert
    4. my experts compute                        (rows regrouped by expert, then put back in order)
    5. all-to-all back (splits swapped)          -> (my assignments, d), in the order of step 1
    6. combine: out[token] += gate * result      (the gates never left this rank)
    7. shared experts (if any): every token, here (replicated on every rank, no all-to-all)

Autograd runs the two payload all-to-alls backwards (``comm.all_to_all``). The experts'
gradients arrive complete: each expert saw the tokens of every rank. The router is replicated:
its gradient on a rank covers that rank's tokens only, and must be summed over the ranks like
any data-parallel parameter (``ep_dp.reduce_gradients``); so are the shared experts'.

**Dropless or capacity.** With ``capacity_factor`` None nothing is dropped: every assignment
reaches its expert, and the rows a rank receives are whatever the routers of all ranks sent it
(steps 2-3 exist for this: the sizes are known only after the counts arrive). With a capacity
C per expert and rank's group, an expert takes at most n x C rows, so a rank's receive buffer
is at most n x C x E/n rows, whatever the routing (``receive_bound``); dropless, only the
routing bounds it: every token of every rank could pick this rank's experts.

Capacity and the balancing loss are per rank (the rank's tokens are one group, router.py):
the one-process ``MoE`` with groups = n makes the same decisions.
"""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn as nn

from source_code.expert_parallel import comm, router
from source_code.expert_parallel.moe import MoE


def owned_experts(n_experts: int, world: int, rank: int) -> range:
    """The experts rank ``rank`` of ``world`` holds: a contiguous block of E/n."""
    if n_experts % world:
        raise ValueError(f"{n_experts} experts do not split evenly over {world} ranks")
    per = n_experts // world
    return range(rank * per, (rank + 1) * per)


def receive_bound(tokens_per_rank: int, n_experts: int, k: int, capacity_factor: float | None,
                  world: int) -> int:
    """The most rows any rank can receive in one dispatch, whatever the routers choose: with a
    capacity, n ranks x C x E/n experts; dropless, every token of every rank sending
    min(k, E/n) of its k distinct choices to this rank's experts."""
    per_rank = len(owned_experts(n_experts, world, 0))
    dropless = world * tokens_per_rank * min(k, per_rank)
    if capacity_factor is None:
        return dropless
    return min(world * router.capacity(tokens_per_rank, n_experts, k, capacity_factor) * per_rank, dropless)


class EPMoE(nn.Module):
    """This rank's part of ``moe``: the router (a copy) and its own experts (copies)."""

    def __init__(self, moe: MoE, group=None):
        super().__init__()
        self.group = group
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.n_experts, self.k, self.capacity_factor = moe.n_experts, moe.k, moe.capacity_factor
        self.renormalise = moe.renormalise
        self.mine = owned_experts(self.n_experts, self.world, self.rank)
        self.router = copy.deepcopy(moe.router)
        self.experts = nn.ModuleList(copy.deepcopy(moe.experts[e]) for e in self.mine)
        self.shared = copy.deepcopy(moe.shared)                   # replicated: every rank, whole
        self.aux_loss = self.z_loss = None
        self.counts = None
        self.balance_bias = moe.balance_bias

    def forward(self, x):                                          # x: (b, t, d), my tokens
        rows = x.reshape(-1, x.shape[-1])                          # (N, d)
        r = router.route(self.router(rows), self.k, self.capacity_factor, 1, self.renormalise,
                         self.balance_bias)
        self.aux_loss, self.counts, self.z_loss = r.aux, r.counts, r.z
        # 1. kept assignments, sorted by expert (stable: token order within an expert)
        token, choice = r.keep.nonzero(as_tuple=True)             # (A,), (A,)
        expert = r.expert[token, choice]
        order = torch.argsort(expert, stable=True)
        token, choice, expert = token[order], choice[order], expert[order]
        per_expert = torch.bincount(expert, minlength=self.n_experts)          # (E,)
        # 2. counts first
        incoming = comm.exchange_counts(per_expert, self.group).view(self.world, len(self.mine))
        send = per_expert.view(self.world, -1).sum(1).tolist()    # rows to each rank
        recv = incoming.sum(1).tolist()                           # rows from each rank
        # 3. payload to the experts' ranks
        received = comm.all_to_all(rows[token], send, recv, self.group)        # (sum(recv), d)
        # 4. my experts
        results = self.run_experts(received, incoming)                         # (sum(recv), d)
        # 5. back to the tokens' ranks
        back = comm.all_to_all(results, recv, send, self.group)               # (A, d)
        # 6. combine with the gate weights
        out = torch.zeros_like(rows).index_add(0, token, back * r.gate[token, choice, None])
        # 7. shared experts: every token, on this rank
        for expert in self.shared:
            out = out + expert(rows)
        return out.view_as(x)

    def run_experts(self, received: torch.Tensor, incoming: torch.Tensor) -> torch.Tensor:
        """Rows arrive by source rank, then by expert: regroup by expert, run each expert on its
        rows, and return the results in the order the rows arrived."""
        local = torch.arange(len(self.mine), device=received.device).repeat(self.world)            # expert of each segment
        which = local.repeat_interleave(incoming.reshape(-1))                 # (rows,) my expert index
        order = torch.argsort(which, stable=True)
        sizes = torch.bincount(which, minlength=len(self.mine)).tolist()
        grouped = received[order].split(sizes)
        outs = torch.cat([expert(rows) for expert, rows in zip(self.experts, grouped)])
        return outs[torch.argsort(order)]                                     # undo the regrouping
