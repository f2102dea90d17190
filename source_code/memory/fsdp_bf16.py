"""FSDP2's MixedPrecisionPolicy counted: the bytes on the wire and the bytes a rank keeps.

    from source_code import processes
    from source_code.memory.fsdp_bf16 import wire_and_state
    processes.spawn(wire_and_state, 2, device="cpu")      # notebook 08, section 3

``fully_shard`` with ``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)``
keeps each rank's shard of every parameter in fp32 (the shard is the master copy), casts the
all-gathered parameters to bf16 for forward and backward, and reduce-scatters the gradients in
fp32, so the shard's gradient and AdamW's moments are fp32 too: 4 + 4 + 8 bytes per parameter
of the shard, and the all-gathers move half the bytes of fp32 training. One step of each, per
block and root as notebook 09 shards the model (its source_code/sharding/fsdp_demo.py measures
the same with the loss alongside), counted with measure.CommCounter and measure.state_bytes.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from source_code import torch_versions, workload
from source_code.measure import CommCounter, local, optimizer_tensors, tensor_bytes

try:  # public from torch 2.6 on
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
except ImportError:  # pragma: no cover - torch < 2.6
    from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard

BF16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def _sharded(cfg: dict, mesh, device, policy):
    model = workload.build_model(cfg, 0, device)
    kwargs = {"mesh": mesh} if policy is None else {"mesh": mesh, "mp_policy": policy}
    for block in model.layers:
        fully_shard(block, **kwargs)             # one all-gather / reduce-scatter group per block
    fully_shard(model, **kwargs)                 # embeddings, final norm, head
    return model


def wire_and_state(dim: int = 64, layers: int = 2) -> dict:
    """On each rank of processes.spawn: {"fp32": {...}, "bf16": {...}} with the payload bytes of
    the step's all-gathers and reduce-scatters, the dtype of the kept shards, and the bytes per
    shard parameter of the parameters, gradients and AdamW moments after the step."""
    from source_code.distributed import context
    from torch.distributed.device_mesh import init_device_mesh
    ctx = context()
    torch_versions.require("fsdp2", ctx.device.type)
    if dim < 1 or layers < 1 or dim % 4:
        raise ValueError(f"dim={dim}, layers={layers}: dim a positive multiple of 4 (4 heads), layers >= 1")
    cfg = workload.model_config(dim=dim, n_layers=layers)
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    x, y = (t.to(ctx.device) for t in workload.rank_slice(
        workload.global_batch(workload.sort_task(64), 0, 8), ctx.rank, ctx.world_size))
    out = {}
    for name, policy in (("fp32", None), ("bf16", BF16)):
        model = _sharded(cfg, mesh, ctx.device, policy)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        counter = CommCounter(ctx.world_size)
        with counter:
            logits = model(x)
            F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=-100).backward()
        opt.step()
        params = list(model.parameters())
        n = sum(local(p).numel() for p in params)
        held = {"params": tensor_bytes(params), "grads": tensor_bytes([p.grad for p in params]),
                "optimizer": tensor_bytes([t for t in optimizer_tensors(opt) if t.dim()])}  # no step counters
        out[name] = {"all_gather": counter.payload["all_gather"],
                     "reduce_scatter": counter.payload["reduce_scatter"],
                     "shard_dtype": str(local(next(model.parameters())).dtype).replace("torch.", ""),
                     "per_param": {k: v / n for k, v in held.items()}}
        if ctx.rank == 0:                                                 # progress, streamed
            print(f"rank 0: FSDP2 {name} step done, all-gathered {out[name]['all_gather']} bytes",
                  flush=True)
        dist.barrier()
    return out
