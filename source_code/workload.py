"""The shared workload of the sharding lessons: TransformerLM on the generated sort task.

* ``model_config``: the TransformerLM sizes, small by default;
* ``init_weights(model, seed)``: every parameter drawn from its own generator (seeded by the
  seed and the parameter's position), so the weights do not depend on how the model is built
  or sharded: a plain model, a model built on the meta device and sharded over 2 or 4 ranks,
  all start from the same numbers (each rank copies its shard of every full tensor, one tensor
  at a time, so the whole model is never materialised on a rank);
* ``global_batch(dataset, step, batch_size, seed)``: the samples of global step ``step``, the
  same whatever the number of ranks; ``rank_slice`` cuts a rank's part out of it;
* ``loss_fn``: next-token cross-entropy (targets -100 are ignored);
* ``lm_loss``: one piece's summed cross-entropy over the valid targets of the WHOLE batch, so
  that the pieces of any split (data-parallel slices, microbatches) add up to the batch's mean.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from source_code import data
from source_code.models import TransformerLM
from source_code.measure import is_dtensor

SORT_VOCAB = 17  # 16 symbols + the separator of data.sequence_task


def model_config(dim: int = 64, n_layers: int = 2, n_heads: int = 4, vocab_size: int = 32,
                 max_len: int = 64) -> dict:
    return {"vocab_size": vocab_size, "dim": dim, "n_layers": n_layers, "n_heads": n_heads,
            "max_len": max_len}


def build_model(cfg: dict, seed: int, device="cpu") -> nn.Module:
    """A plain (unsharded) TransformerLM with the deterministic weights of ``init_weights``."""
    model = TransformerLM(**cfg).to(device)
    init_weights(model, seed)
    return model


def _full_value(name: str, shape, seed: int, index: int, device) -> torch.Tensor:
    """The full initial value of one parameter, as TransformerLM._init draws it."""
    if name.endswith("norm1.weight") or name.endswith("norm2.weight") or name == "norm.weight":
        return torch.ones(shape, device=device)
    if name.endswith(".bias"):
        return torch.zeros(shape, device=device)
    g = torch.Generator().manual_seed(seed * 100_003 + index)
    return (torch.randn(shape, generator=g) * 0.02).to(device)


@torch.no_grad()
def init_weights(model: nn.Module, seed: int) -> None:
    """Fill every parameter (plain or a sharded DTensor) with its seed-determined value."""
    for index, (name, p) in enumerate(model.named_parameters()):
        device = p.device if p.device.type != "meta" else torch.device("cpu")
        full = _full_value(name, p.shape, seed, index, device)       # one full tensor at a time
        if is_dtensor(p):
            p.to_local().copy_(_my_shard(full, p))
        else:
            p.copy_(full)


def _my_shard(full: torch.Tensor, p) -> torch.Tensor:
    """The part of ``full`` that this rank holds of the DTensor ``p`` (Shard(0)/Replicate placements)."""
    out = full
    for dim_of_mesh, placement in enumerate(p.placements):
        if placement.is_shard():
            n = p.device_mesh.size(dim_of_mesh)
            k = p.device_mesh.get_local_rank(dim_of_mesh)
            d = placement.dim
            c = -(-out.shape[d] // n)                                # torch.chunk's size
            out = out.narrow(d, min(k * c, out.shape[d]), max(0, min(c, out.shape[d] - k * c)))
    return out.to(p.to_local().device)


def sort_task(n: int = 2048):
    return data.sequence_task("sort", n=n)


def global_batch(dataset, step: int, batch_size: int, seed: int = 0):
    """(inputs, targets) of global step ``step``: a new permutation every epoch, world-size free."""
    epoch, i = divmod(step, len(dataset) // batch_size)
    return epoch_batch(dataset, epoch, i, batch_size, seed)


def epoch_batch(dataset, epoch: int, i: int, batch_size: int, seed: int = 0):
    """(inputs, targets) of the i-th global batch of ``epoch`` (drop_last: full batches only)."""
    n = len(dataset)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch))
    idx = order[i * batch_size:(i + 1) * batch_size]
    x, y = dataset.tensors
    return x[idx], y[idx]                                            # (B, T), (B, T)


def rank_slice(batch, rank: int, world_size: int):
    """This rank's B/N consecutive samples of a global batch."""
    x, y = batch
    b = x.shape[0] // world_size
    return x[rank * b:(rank + 1) * b], y[rank * b:(rank + 1) * b]     # (B/N, T), (B/N, T)


def loss_fn(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    logits = model(x)                                                # (b, T, vocab)
    return F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100)


@torch.no_grad()
def token_accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Fraction of the scored positions (target != -100) predicted exactly."""
    pred = model(x).argmax(-1)                                       # (b, T)
    keep = y != -100
    return (pred[keep] == y[keep]).float().mean().item()

def lm_loss(logits: torch.Tensor, targets: torch.Tensor, n_valid: int) -> torch.Tensor:
    """Summed cross-entropy of one microbatch / valid targets of the WHOLE batch.

    logits: (b, t, vocab), targets: (b, t) with -100 where nothing is predicted. The sum over
    microbatches is the whole batch's mean loss, whatever each microbatch's share of targets.
    """
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100,
                           reduction="sum") / n_valid
