"""Cutting a model into pipeline stages.

* ``TransformerStage``: a slice of ``models.TransformerLM``: the first stage embeds the tokens,
  every stage runs its share of the blocks, the last one applies the final norm and the head.
  Built from a full model, so every rank can build the same full model from one seed and
  keep only its slice (``source_names`` maps its parameters to the full model's names).
* ``mlp_stack`` / ``mlp_stages``: equal Linear+tanh layers, the same work on every stage: the
  clean setting for measuring the bubble against the formula, which assumes equal stages.
* ``lm_loss``: the last stage's loss for one microbatch, scaled so that the microbatch losses
  add up to the mean loss of the whole batch (so their gradients add up to its gradient).
"""
from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from source_code import models
from source_code.workload import lm_loss  # noqa: F401  (the loss every stage split uses)


def split_layers(n_layers: int, n_stages: int) -> list[tuple[int, int]]:
    """Contiguous [lo, hi) ranges of layers, as equal as possible, earlier stages taking the extra."""
    if n_stages > n_layers:
        raise ValueError(f"{n_layers} layers cannot fill {n_stages} stages: use --layers "
                         f">= {n_stages} (one block per stage at least)")
    base, extra = divmod(n_layers, n_stages)
    bounds, lo = [], 0
    for s in range(n_stages):
        hi = lo + base + (1 if s < extra else 0)
        bounds.append((lo, hi))
        lo = hi
    return bounds


class TransformerStage(nn.Module):
    """Stage ``stage`` of ``n_stages`` of a TransformerLM (copies of its modules)."""

    def __init__(self, full: models.TransformerLM, stage: int, n_stages: int):
        super().__init__()
        lo, hi = split_layers(len(full.layers), n_stages)[stage]
        self.first, self.last = stage == 0, stage == n_stages - 1
        names = []
        if self.first:
            self.tok, self.pos = copy.deepcopy(full.tok), copy.deepcopy(full.pos)
            names += ["tok.weight", "pos.weight"]
        self.layers = nn.ModuleList(copy.deepcopy(full.layers[i]) for i in range(lo, hi))
        names += [f"layers.{i}.{n}" for i in range(lo, hi) for n, _ in full.layers[i].named_parameters()]
        if self.last:
            self.norm, self.head = copy.deepcopy(full.norm), copy.deepcopy(full.head)
            names += [f"norm.{n}" for n, _ in full.norm.named_parameters()] + ["head.weight"]
        self.source_names = names  # full-model name of each of self.parameters(), in order
        assert len(names) == len(list(self.parameters()))

    def forward(self, x):
        if self.first:  # x: (b, t) token ids -> (b, t, dim)
            x = self.tok(x) + self.pos(torch.arange(x.shape[1], device=x.device))
        for layer in self.layers:  # (b, t, dim) -> (b, t, dim)
            x = layer(x)
        return self.head(self.norm(x)) if self.last else x  # last: (b, t, vocab)


def transformer_stages(full: models.TransformerLM, n_stages: int) -> list[TransformerStage]:
    return [TransformerStage(full, s, n_stages) for s in range(n_stages)]


def mlp_stack(width: int, n_layers: int, seed: int = 0) -> nn.Sequential:
    """n_layers x (Linear(width, width) + tanh), seeded: the same on every rank."""
    torch.manual_seed(seed)
    return nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.Tanh()) for _ in range(n_layers)])


class MLPStage(nn.Sequential):
    """A contiguous slice of an mlp_stack (with ``source_names`` like TransformerStage)."""

    def __init__(self, full: nn.Sequential, stage: int, n_stages: int):
        lo, hi = split_layers(len(full), n_stages)[stage]
        super().__init__(*[copy.deepcopy(full[i]) for i in range(lo, hi)])
        self.first, self.last = stage == 0, stage == n_stages - 1
        self.source_names = [f"{i}.{n}" for i in range(lo, hi) for n, _ in full[i].named_parameters()]




def mse_loss(out: torch.Tensor, target: torch.Tensor, n_total: int) -> torch.Tensor:
    """Summed squared error / elements of the whole batch (the MLP stack's loss)."""
    return (out - target).pow(2).sum() / n_total


def full_model_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, kind: str) -> torch.Tensor:
    """The unsplit model's loss on the whole batch: the reference every schedule must equal."""
    out = model(x)
    if kind == "transformer":
        return lm_loss(out, y, int((y != -100).sum()))
    return mse_loss(out, y, y.numel())
