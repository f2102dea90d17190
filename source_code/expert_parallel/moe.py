"""The mixture-of-experts layer on one process, and the TransformerLM built with it.

``MoE`` replaces a block's MLP: a router picks k of E experts for each token (router.py),
each expert is an ordinary ``models.MLP`` (dim -> hidden -> dim), and the token's output is
the gate-weighted sum of its experts' outputs. The block adds it to the residual, so a token
dropped at every choice (over capacity) leaves the layer unchanged.

    x (b, t, d) -> rows (N, d) -> route -> for each expert e: its rows -> MLP_e -> (rows, d)
                -> out[token] += gate * MLP_e(x[token])   -> (b, t, d)

**Shared experts** (DeepSeek-MoE, DeepSeek-V3): ``n_shared`` more MLPs that every token passes
through, whatever the router says; their outputs are added to the routed experts' combine:

    out[token] = sum_j gate_j * MLP_e_j(x[token]) + sum_s shared_s(x[token])

They hold what every token needs (so the routed experts need not each learn it again); under
expert parallelism they are replicated on every rank like the dense layers, and their
gradients are summed over the ranks like DDP's (ep_dp.is_expert says no to them).

The layer keeps the balancing loss of its last forward in ``aux_loss`` (a tensor in the
graph: the training loss adds coef * the sum over layers) and the assignments per expert and
group in ``counts``. Parameters grow with E; the work per token does not: every token runs
through k experts, whatever E is (``active_parameters``).

``moe_transformer`` builds ``models.TransformerLM`` and swaps each block's MLP for a MoE:
the same model as the rest of the workshop, from one seed, the same weights on every rank.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from source_code.expert_parallel import router
from source_code.models import MLP, TransformerLM


class MoE(nn.Module):
    def __init__(self, dim: int, hidden: int, n_experts: int, k: int = 1,
                 capacity_factor: float | None = None, groups: int = 1, renormalise: bool | None = None,
                 n_shared: int = 0):
        super().__init__()
        if n_experts < 1 or not 1 <= k <= n_experts:
            raise ValueError(f"a MoE needs 1 <= k <= n_experts, got k={k}, n_experts={n_experts}")
        if capacity_factor is not None and not capacity_factor > 0:
            raise ValueError(f"capacity_factor must be > 0 (or None: no limit), got {capacity_factor}")
        if isinstance(n_shared, bool) or not isinstance(n_shared, int) or n_shared < 0:
            raise ValueError(f"n_shared must be a whole number >= 0 (0: no shared expert), got {n_shared!r}")
        self.n_experts, self.k, self.capacity_factor, self.groups = n_experts, k, capacity_factor, groups
        self.renormalise = renormalise                     # None: renormalised gates for k >= 2
        self.router = nn.Linear(dim, n_experts, bias=False)
        self.experts = nn.ModuleList(MLP(dim, hidden) for _ in range(n_experts))
        self.shared = nn.ModuleList(MLP(dim, hidden) for _ in range(n_shared))   # every token, always
        self.aux_loss = self.z_loss = None
        self.counts = None
        self.balance_bias = None                           # (E,) aux-free balancing (router.update_bias)

    def forward(self, x):                                  # x: (b, t, d)
        rows = x.reshape(-1, x.shape[-1])                  # (N, d)
        r = router.route(self.router(rows), self.k, self.capacity_factor, self.groups, self.renormalise,
                         self.balance_bias)
        self.aux_loss, self.counts, self.z_loss = r.aux, r.counts, r.z
        out = combine(rows, r, self.experts)
        for expert in self.shared:                         # shared experts: every token, no gate
            out = out + expert(rows)
        return out.view_as(x)


def combine(rows: torch.Tensor, r: router.Routing, experts) -> torch.Tensor:
    """sum over a token's kept choices of gate * expert(token): (N, d) -> (N, d)."""
    out = torch.zeros_like(rows)
    for e, expert in enumerate(experts):
        token, choice = ((r.expert == e) & r.keep).nonzero(as_tuple=True)   # (n_e,), (n_e,)
        y = expert(rows[token])                                               # (n_e, d)
        out = out.index_add(0, token, y * r.gate[token, choice, None])
    return out


def moe_transformer(cfg: dict, n_experts: int = 4, k: int = 1, capacity_factor: float | None = None,
                    groups: int = 1, seed: int = 0, hidden: int | None = None,
                    renormalise: bool | None = None, n_shared: int = 0) -> TransformerLM:
    """``models.TransformerLM(**cfg)`` with every block's MLP swapped for a MoE (hidden: 4*dim,
    the dense MLP's size; ``n_shared`` shared experts of the same size); weights drawn as
    TransformerLM draws them, from ``seed``."""
    torch.manual_seed(seed)
    model = TransformerLM(**cfg)
    dim = cfg["dim"]
    for block in model.layers:
        block.mlp = MoE(dim, hidden or 4 * dim, n_experts, k, capacity_factor, groups, renormalise, n_shared)
    model.apply(TransformerLM._init)
    return model


def moe_layers(model: nn.Module) -> list:
    """The MoE-like layers of a model (anything with an ``aux_loss``), in order."""
    return [m for m in model.modules() if hasattr(m, "aux_loss")]


def aux_loss(model: nn.Module) -> torch.Tensor:
    """The sum of the layers' balancing losses from the last forward."""
    return sum(m.aux_loss for m in moe_layers(model))


def z_loss(model: nn.Module) -> torch.Tensor:
    """The sum of the layers' router z-losses from the last forward."""
    return sum(m.z_loss for m in moe_layers(model))


def set_routing(model: nn.Module, k: int | None = None, capacity_factor=..., groups: int | None = None,
                renormalise=...):
    """Change k / capacity factor / groups / renormalise of every MoE layer in place (what is
    not given stays; an expert-parallel layer has no groups: its rank's tokens are one)."""
    for m in moe_layers(model):
        if k is not None:
            if not 1 <= k <= m.n_experts:
                raise ValueError(f"k must be between 1 and {m.n_experts}, got {k}")
            m.k = k
        if capacity_factor is not ...:
            if capacity_factor is not None and not capacity_factor > 0:
                raise ValueError(f"capacity_factor must be > 0 (or None), got {capacity_factor}")
            m.capacity_factor = capacity_factor
        if groups is not None:
            m.groups = groups
        if renormalise is not ...:
            m.renormalise = renormalise


def active_parameters(moe: MoE) -> dict:
    """Parameters of the layer, and those one token's forward multiplies by (router + k routed
    experts + the shared ones)."""
    per_expert = sum(p.numel() for p in moe.experts[0].parameters())
    routing = sum(p.numel() for p in moe.router.parameters())
    shared = sum(p.numel() for p in moe.shared.parameters())
    return {"total": routing + moe.n_experts * per_expert + shared, "per_token": routing + moe.k * per_expert + shared,
            "per_expert": per_expert, "router": routing, "shared": shared}
