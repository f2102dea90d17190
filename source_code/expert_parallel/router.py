"""Routing of a mixture-of-experts layer: top-k gating, capacity, the load-balancing loss.

A router is one linear layer, dim -> n_experts, without bias. For each token (a row of x):

    probs = softmax(x @ W_router^T)           (N, E)  a distribution over the experts
    expert, p = top-k of probs                (N, k)  the k chosen experts, best first, and
                                                      their probabilities
    gate = p / p.sum(-1)   (k >= 2)            (N, k)  the gate weights: renormalised over the k
    gate = p               (k == 1)                    Switch Transformer: the probability itself

The layer's output for a token is sum_j gate_j * expert_j(x) over its k choices.

**Renormalised or not.** GShard's top-2 gating divides the two gates by their sum
(g1 / (g1 + g2), g2 / (g1 + g2)), as Mixtral and most top-k MoEs do: a token's output is a
weighted *average* of its experts' outputs, whatever probability mass the k carry. Switch
Transformer routes top-1 and keeps the softmax probability as the gate: renormalised, a single
gate would always be 1 and the router would get no gradient from the output (only from the
balancing loss). Without renormalisation a top-k output is the renormalised one scaled by the
kept mass p.sum(-1) < 1. ``renormalise=None`` (the default) picks by k: renormalised for
k >= 2, the probability for k = 1; True / False force either.

**Capacity.** Each expert takes at most C = ceil(capacity_factor * N * k / E) assignments of a
group of N tokens (the mean load times the factor). Assignments over it are *dropped*: the
expert does not see the token, its gate term is 0, and the token goes on through the residual
connection of the block (x + moe(x): a fully dropped token leaves the layer as x). Priority:
all first choices before any second choice, then token order (GShard's rule). capacity_factor
None: no limit, nothing dropped (dropless routing; ep_layer.py says what it does to the buffers).

**Groups.** Capacity and the balancing loss are computed per *group* of consecutive tokens
(GShard's "groups"). Under expert parallelism a rank routes its own tokens without seeing the
others', so a rank is a group; the one-process reference with ``groups = world size`` makes
exactly the same decisions.

**Balancing loss** (Switch Transformer): per group, E * sum_e f_e * P_e with f_e the fraction
of the group's k*N assignments that chose expert e (counted before dropping, not
differentiable) and P_e the mean router probability of e (differentiable); the mean over the
groups. It is 1 when both are uniform and grows when the router favours some experts: its
gradient lowers the probability of the experts that receive the most tokens.

**Balancing without an auxiliary loss** (DeepSeek-V3): each expert has a bias b_e that is added
to the routing scores for the *choice* of the top k only; the gates stay the probabilities
(renormalised as above), so the bias changes who is chosen, never how much a chosen expert
counts, and adds no gradient that competes with the language-modelling loss. After each step
the bias of every overloaded expert goes down by a rate gamma and that of every underloaded one
up: b_e += gamma * sign(mean load - load_e) (``update_bias``).

**Router z-loss** (ST-MoE): the mean over tokens of logsumexp(logits)^2. It pulls the router's
logits towards small values, where the softmax is not saturated and a bf16 exponential does
not round away; its coefficient is small (ST-MoE: 0.001).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class Routing:
    """The routing decision for N tokens (rows)."""
    probs: torch.Tensor    # (N, E) softmax of the router logits (differentiable)
    expert: torch.Tensor   # (N, k) int64, the chosen experts, best first
    gate: torch.Tensor     # (N, k) the gate weights (differentiable), renormalised or not
    keep: torch.Tensor     # (N, k) bool, False where the assignment is over capacity (dropped)
    aux: torch.Tensor      # () the load-balancing loss (mean over the groups)
    counts: torch.Tensor   # (groups, E) int64, assignments per expert and group, before dropping
    z: torch.Tensor = None  # () the router z-loss of these logits


def capacity(n_tokens: int, n_experts: int, k: int, factor: float | None) -> int:
    """Assignments one expert accepts from a group of ``n_tokens``: ceil(factor * N * k / E)."""
    if n_tokens < 1 or n_experts < 1 or not 1 <= k <= n_experts:
        raise ValueError(f"capacity needs n_tokens >= 1 and 1 <= k <= n_experts, got n_tokens={n_tokens}, "
                         f"k={k}, n_experts={n_experts}")
    if factor is not None and not factor > 0:
        raise ValueError(f"capacity_factor must be > 0 (or None: no limit), got {factor}")
    if factor is None:
        return n_tokens                         # every token at most once per expert: no limit
    return math.ceil(factor * n_tokens * k / n_experts)


def top_k(logits: torch.Tensor, k: int, renormalise: bool | None = None, bias: torch.Tensor | None = None):
    """(probs (N, E), expert (N, k), gate (N, k)) of router logits (N, E); the gates
    renormalised over the k choices when ``renormalise`` (None: when k >= 2). ``bias`` (E,):
    added to the probabilities for the choice only (aux-loss-free balancing)."""
    probs = torch.softmax(logits, dim=-1)
    if bias is None:
        p, expert = probs.topk(k, dim=-1)       # best first
    else:
        expert = (probs.detach() + bias).topk(k, dim=-1).indices   # chosen with the bias ...
        p = probs.gather(1, expert)                                # ... weighted without it
    if renormalise is None:
        renormalise = k >= 2
    gate = p / p.sum(-1, keepdim=True) if renormalise else p
    return probs, expert, gate


def within_capacity(expert: torch.Tensor, n_experts: int, cap: int) -> torch.Tensor:
    """(N, k) bool: True where the assignment is among the first ``cap`` of its expert.

    Queue order: all first choices in token order, then all second choices, ..."""
    n, k = expert.shape
    queue = expert.t().reshape(-1)                              # (k*N,) choice-major
    onehot = F.one_hot(queue, n_experts)                        # (k*N, E)
    position = (onehot.cumsum(0) - 1).gather(1, queue[:, None])[:, 0]  # place in its expert's queue
    return (position < cap).reshape(k, n).t()


def tokens_per_expert(expert: torch.Tensor, n_experts: int, keep: torch.Tensor | None = None):
    """(E,) int64: assignments per expert (only the kept ones when ``keep`` is given)."""
    chosen = expert if keep is None else expert[keep]
    return torch.bincount(chosen.reshape(-1), minlength=n_experts)


def balance_loss(probs: torch.Tensor, expert: torch.Tensor) -> torch.Tensor:
    """Switch Transformer's auxiliary loss of one group: E * sum_e f_e * P_e (1 when uniform)."""
    n, n_experts = probs.shape
    f = tokens_per_expert(expert, n_experts).to(probs.dtype) / expert.numel()   # (E,) no gradient
    p = probs.mean(0)                                                          # (E,)
    return n_experts * (f * p).sum()


def z_loss(logits: torch.Tensor) -> torch.Tensor:
    """ST-MoE's router z-loss: mean over tokens of logsumexp(logits)^2."""
    return torch.logsumexp(logits, dim=-1).square().mean()


def update_bias(bias: torch.Tensor | None, load: torch.Tensor, rate: float) -> torch.Tensor:
    """DeepSeek-V3's bias step: down by ``rate`` for experts above the mean load, up below."""
    load = load.to(torch.float32)
    bias = torch.zeros_like(load) if bias is None else bias
    return bias + rate * torch.sign(load.mean() - load)


def route(logits: torch.Tensor, k: int, capacity_factor: float | None = None,
          groups: int = 1, renormalise: bool | None = None, bias: torch.Tensor | None = None) -> Routing:
    """Route N tokens given their router logits (N, E); capacity and aux loss per group."""
    if logits.dim() != 2 or logits.shape[0] < 1:
        raise ValueError(f"logits must be (tokens >= 1, experts), got shape {tuple(logits.shape)}")
    n, n_experts = logits.shape
    if not 1 <= k <= n_experts:
        raise ValueError(f"k must be between 1 and the number of experts {n_experts}, got {k}")
    if groups < 1 or n % groups:
        raise ValueError(f"{n} tokens do not split into {groups} equal groups; use a divisor of {n}")
    probs, expert, gate = top_k(logits, k, renormalise, bias)
    size = n // groups
    cap = capacity(size, n_experts, k, capacity_factor)
    keep = torch.cat([within_capacity(e, n_experts, cap) for e in expert.split(size)])
    aux = torch.stack([balance_loss(p, e) for p, e in zip(probs.split(size), expert.split(size))]).mean()
    counts = torch.stack([tokens_per_expert(e, n_experts) for e in expert.split(size)])
    return Routing(probs, expert, gate, keep, aux, counts, z_loss(logits))


def dropped_fraction(counts, n_tokens: int, k: int, factor: float | None) -> float:
    """The share of assignments over capacity, from per-group counts (groups, E) of groups of
    ``n_tokens`` tokens: sum of max(0, count - C) / all assignments (exact: the rule drops
    exactly what exceeds C, whichever tokens those are)."""
    counts = torch.as_tensor(counts)
    cap = capacity(n_tokens, counts.shape[-1], k, factor)
    return float((counts - cap).clamp(min=0).sum() / counts.sum())
