"""FSDP by hand in mixed precision: bf16 on the wire and in the computation, fp32 master shards.

    torchrun --standalone --nproc-per-node=4 -m source_code.sharding.own_fsdp_report  # checks it

What FSDP2's ``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32,
output_dtype=float32)`` does, on top of own_fsdp.Unit:

* the shard a rank keeps stays fp32: it is the **master copy** the optimizer steps (AdamW's
  state fp32 too, 1/N of it per rank);
* gather: the shard is cast to bf16 *before* the all-gather, so the wire carries 2 bytes a
  parameter instead of 4, and the full buffer (N * c,) is bf16: the unit computes in bf16;
* reduce: the unit's full gradient (bf16, as its parameters) is cast to fp32 *before* the
  reduce-scatter (issued and waited for as in own_fsdp.Unit), so the N ranks' gradients are
  added in fp32, and the shard's gradient is fp32;
* the replicated LayerNorms compute with a bf16 cast of their fp32 parameters (FSDP2 casts
  every parameter it manages); autograd casts their gradients back to fp32 for the all-reduce;
* the model's output (the logits) is cast to fp32, so the loss is computed in fp32.

    shard (c,) fp32 --cast--> (c,) bf16 --all-gather--> full (N * c,) bf16 --> forward/backward
    full.grad (N * c,) bf16 --cast--> fp32 --reduce-scatter--> shard.grad (c,) fp32 --> AdamW
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from source_code.sharding.own_fsdp import REPLICATED, Unit, alloc_storage, free_storage, shard_by_hand


class MixedPrecisionUnit(Unit):
    """A Unit whose full buffer is in ``param_dtype`` (gathered in it) and whose gradient is
    reduced in ``reduce_dtype``; the shard stays in the dtype the model was built in (fp32)."""

    param_dtype = torch.bfloat16     # what the unit computes with, and what the all-gather carries
    reduce_dtype = torch.float32     # what the reduce-scatter adds up in

    def gather(self) -> None:
        alloc_storage(self.full)
        mine = self.shard.detach().to(self.param_dtype)            # (c,) bf16: half the bytes
        dist.all_gather_into_tensor(self.full.data, mine)

    def reduce_grad(self) -> None:
        grad, self.full.grad = self.full.grad.to(self.reduce_dtype), None   # (N * c,) bf16 -> fp32
        free_storage(self.full)
        self.start_reduce(grad)                                    # added up in fp32


def compute_in(norm: nn.LayerNorm, dtype: torch.dtype) -> None:
    """``norm`` computes with ``dtype`` casts of its (fp32, replicated) weight and bias."""
    def forward(x):
        return F.layer_norm(x, norm.normalized_shape, norm.weight.to(dtype), norm.bias.to(dtype), norm.eps)
    norm.forward = forward


def shard_mixed(model: nn.Module, units=None, output_dtype=torch.float32) -> list[MixedPrecisionUnit]:
    """shard_by_hand with MixedPrecisionUnits; the replicated modules compute in the units'
    param_dtype and the model's output is cast to ``output_dtype``."""
    made = shard_by_hand(model, units, unit_class=MixedPrecisionUnit)
    for m in model.modules():
        if isinstance(m, REPLICATED):
            compute_in(m, MixedPrecisionUnit.param_dtype)
    model.register_forward_hook(lambda m, args, out: out.to(output_dtype))
    return made
