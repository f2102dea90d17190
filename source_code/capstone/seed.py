"""One model, one seed checkpoint, one data order: what every configuration of the capstone shares.

* ``config()``: the TransformerLM sizes (small: 2 layers, the 2 stages of every pipeline here);
* ``save_seed(path)``: the dense TransformerLM and its MoE variant initialised once and saved
  (a seed checkpoint, as torchtitan's convergence checks start from one); every configuration
  ``load_seed``s it, whatever it shards afterwards;
* ``batches(steps, batch_size)``: the global batches of the sort task, with a different number
  of valid targets in every sample (the rest masked to -100, as padding or a masked loss does):
  uneven token counts on purpose, so that only a correctly normalised loss matches;
* ``reference(...)``: one process on the whole global batch: the loss curve and final weights,
  in fp32 or in fp64 (``dtype``: the model's weights and arithmetic; the data are integers).

The loss of a step is ``loss.global_token_loss``: the summed cross-entropy / the number of
valid targets of the WHOLE global batch, so that any split adds up to it.
"""
from __future__ import annotations

import torch

from source_code import workload
from source_code.capstone.loss import global_token_loss, local_token_count
from source_code.expert_parallel.moe import moe_transformer
from source_code.mesh.reference import make_optimizer

N_EXPERTS = 4
LR = 0.1


def config(layers: int = 2, dim: int = 32, heads: int = 4) -> dict:
    return workload.model_config(dim=dim, n_layers=layers, n_heads=heads)


def moe_model(cfg: dict, seed: int = 0):
    """The MoE TransformerLM (notebook 14): top-1 routing, no capacity limit (no token dropped)."""
    return moe_transformer(cfg, N_EXPERTS, k=1, capacity_factor=None, seed=seed)


def save_seed(path, cfg: dict | None = None, seed: int = 0) -> str:
    cfg = cfg or config()
    torch.save({"cfg": cfg, "dense": workload.build_model(cfg, seed).state_dict(),
                "moe": moe_model(cfg, seed).state_dict()}, path)
    return str(path)


def load_seed(path, kind: str = "dense", dtype=torch.float32, device="cpu"):
    """A fresh model holding the seed checkpoint's weights (every rank: the whole model), in
    ``dtype`` (fp64: the fp32 seed values exactly, then computed in double precision)."""
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    model = workload.build_model(ckpt["cfg"], 0) if kind == "dense" else moe_model(ckpt["cfg"])
    model.load_state_dict(ckpt[kind])
    return model.to(device=device, dtype=dtype)


def ragged(y: torch.Tensor, seed: int) -> torch.Tensor:
    """Keep a random number (1 .. all) of each sample's valid targets, mask the rest to -100."""
    g = torch.Generator().manual_seed(10_000 + seed)
    y = y.clone()
    for row in y:
        valid = (row != -100).nonzero().flatten()
        keep = int(torch.randint(1, len(valid) + 1, (1,), generator=g))
        row[valid[keep:]] = -100
    return y


def batches(steps: int, batch_size: int, seed: int = 0) -> list:
    """[(x (B, T), y (B, T)), ...]: the same global batches, in the same order, for everyone."""
    dataset = workload.sort_task(n=256)
    out = []
    for s in range(steps):
        x, y = workload.global_batch(dataset, s, batch_size, seed)
        out.append((x, ragged(y, seed * 1000 + s)))
    return out


def n_valid(y: torch.Tensor) -> int:
    return int((y != -100).sum())


def reference(path, data, kind: str = "dense", lr: float = LR, pieces: int = 1,
              dtype=torch.float32, device="cpu") -> tuple[list[float], dict]:
    """(loss of every step, name -> final weight): one process on the whole global batch.

    ``pieces`` > 1: the batch in that many consecutive slices, their gradients accumulated in
    order (the same numbers a data-parallel run adds, summed in rank order)."""
    model = load_seed(path, kind, dtype, device)
    opt = make_optimizer(model.parameters(), lr)
    losses = []
    for x, y in data:
        count, total = local_token_count([y]), 0.0
        for xs, ys in zip(x.chunk(pieces), y.chunk(pieces)):
            loss = global_token_loss(model(xs.to(device)), ys.to(device), count)
            loss.backward()
            total += loss.item()
        opt.step()
        opt.zero_grad()
        losses.append(total)
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}
