"""Tensor parallelism of the TransformerLM with DTensor, and the 2D (dp x tp) model.

The plan cuts each block the Megatron way, so one block costs two all-reduces of the
activations forward (after ``wo`` and after ``down``) and the matching ones backward:

    wq, wk, wv, up   ColwiseParallel   weight Shard(0): each rank computes some heads / hidden units
    wo, down         RowwiseParallel   weight Shard(1): partial sums, all-reduced to Replicate

Embeddings, LayerNorms and the head stay replicated on the tp dimension (every tp rank holds
them whole and computes the same values). ``Attention.forward`` reshapes with ``-1`` heads, so
it runs unchanged on the local heads.

2D: ``parallelize_module`` on the "tp" submesh first, then ``fully_shard`` on the "dp" submesh
(per block, then the root). FSDP2 shards each TP shard again along dim 0, so a weight's
placements become (dp: Shard(0) [strided], tp: Shard(k)).
"""
from __future__ import annotations

from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from source_code import torch_versions
from source_code.models import TransformerLM

try:  # public from torch 2.6 on
    from torch.distributed.fsdp import fully_shard
except ImportError:  # pragma: no cover - torch < 2.6
    from torch.distributed._composable.fsdp import fully_shard


def block_plan() -> dict:
    """The per-block TP plan (module path inside a Block -> style)."""
    return {"attn.wq": ColwiseParallel(), "attn.wk": ColwiseParallel(),
            "attn.wv": ColwiseParallel(), "attn.wo": RowwiseParallel(),
            "mlp.up": ColwiseParallel(), "mlp.down": RowwiseParallel()}


def check_divisible(cfg: dict, tp: int) -> str | None:
    """Why ``cfg`` cannot be split ``tp`` ways, or None."""
    if cfg["n_heads"] % tp:
        return f"{cfg['n_heads']} heads do not divide among {tp} tp ranks"
    return None


def apply_tp(model: TransformerLM, tp_mesh) -> TransformerLM:
    """Tensor-parallelise every block of ``model`` on the 1-D ``tp_mesh`` (in place)."""
    for block in model.layers:
        parallelize_module(block, tp_mesh, block_plan())
    return model


def apply_fsdp(model: nn.Module, dp_mesh, blocks=None) -> nn.Module:
    """FSDP2 on the 1-D ``dp_mesh``: one group per block, then the root."""
    torch_versions.require("fsdp2", dp_mesh.device_type)  # one line on an older torch, not a crash
    for block in (model.layers if blocks is None else blocks):
        fully_shard(block, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)
    return model


def build_2d(model: TransformerLM, mesh) -> TransformerLM:
    """TP on mesh["tp"], then FSDP2 on mesh["dp"]. ``model`` holds the full initial weights
    (the same on every rank): each rank keeps its shards of them."""
    apply_tp(model, mesh["tp"])
    if mesh["dp"].size() > 1:
        apply_fsdp(model, mesh["dp"])
    return model
