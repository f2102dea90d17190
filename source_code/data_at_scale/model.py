"""The model, the batches and the loss that notebook 20's runs share (plumbing).

* ``build``: a small TransformerLM for the sort task (notebook 09's workload, seeded weights);
* ``collate(samples, ids)``: (inputs, targets, weights) of a batch from the (n, 33) array of
  stored sequences; a PAD id becomes a sample of weight 0 (same shapes on every rank);
* ``weighted_loss(model, x, y, w, per)``: the weighted sum of the per-sample losses divided by
  ``per``: pass this rank's real samples for a plain mean; with DDP, pass the global batch's
  real samples / world size, and DDP's mean of the ranks' gradients is the global batch's mean.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from source_code import workload
from source_code.data_at_scale.cursor import PAD
from source_code.data_at_scale.formats import TOKENS

VOCAB = TOKENS + 1   # 16 symbols and the separator


def build(dim: int = 32, layers: int = 2, seed: int = 0, device="cpu") -> torch.nn.Module:
    cfg = workload.model_config(dim=dim, n_layers=layers, n_heads=4, vocab_size=VOCAB, max_len=2 * TOKENS)
    return workload.build_model(cfg, seed, device)


def collate(samples: np.ndarray, ids: list[int], device="cpu"):
    """(x (b, 32), y (b, 32), w (b,)) for the ids; PAD slots carry sample 0 with weight 0."""
    idx = np.array([0 if i == PAD else i for i in ids], dtype=np.int64)
    seq = torch.from_numpy(samples[idx].astype(np.int64))                    # (b, 33)
    x, y = seq[:, :-1].clone(), seq[:, 1:].clone()
    y[:, :TOKENS] = -100                                                      # only the answer is scored
    w = torch.tensor([0.0 if i == PAD else 1.0 for i in ids])
    return x.to(device), y.to(device), w.to(device)


def sample_losses(model, x, y) -> torch.Tensor:
    """(b,) mean cross-entropy of each sample over its scored positions."""
    logits = model(x)                                                         # (b, 32, vocab)
    per_token = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100,
                                reduction="none").view(y.shape)               # (b, 32)
    return per_token.sum(1) / (y != -100).sum(1)


def weighted_loss(model, x, y, w, per: float | None = None) -> torch.Tensor:
    """sum_i w_i * loss_i / per (per: this batch's real samples when None)."""
    per = float(w.sum()) if per is None else per
    return (w * sample_losses(model, x, y)).sum() / max(per, 1.0)


@torch.no_grad()
def eval_loss(model, samples: np.ndarray) -> float:
    x, y, w = collate(samples, list(range(len(samples))))
    return weighted_loss(model, x, y, w).item()
