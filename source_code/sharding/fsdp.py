"""FSDP2 (``fully_shard``) on the workshop's TransformerLM.

``fully_shard(module)`` turns each parameter of ``module`` into a DTensor sharded on dim 0
across the mesh: rank r keeps rows [r*c, (r+1)*c) of every weight. The module becomes one
*communication group*: before its forward its parameters are all-gathered (one collective for
the whole group), after its forward they are freed again (``reshard_after_forward=True``,
ZeRO-3) or kept until backward (``False``, ZeRO-2-like: fewer all-gathers, more memory); in
backward they are all-gathered again if they were freed, and the gradients are
reduce-scattered so each rank keeps the gradient of its own rows. The optimizer, created after
sharding, sees only the shards: its state is 1/N per rank.

Wrapping per transformer block makes one group per block, so at most about one block is
unsharded at a time; the last call on the root picks up what is left (embeddings, final norm,
head).

Memory: built normally, every rank first holds the whole model. Built on the meta device
(shapes only), sharded, then materialised with ``to_empty`` and initialised, a rank only ever
allocates its shards.

    torchrun --standalone --nproc-per-node=4 -m source_code.sharding.fsdp_demo
"""
from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from source_code import torch_versions
from source_code.models import TransformerLM
from source_code.workload import init_weights

try:  # public from torch 2.6 on
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
except ImportError:  # pragma: no cover - torch < 2.6
    from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard


def shard_model(model: TransformerLM, mesh, reshard_after_forward: bool = True,
                mp_policy: MixedPrecisionPolicy | None = None, head_policy=None) -> TransformerLM:
    """fully_shard each block, then the root (embeddings, final norm, head). ``head_policy``:
    the head in a group of its own with that policy (fp32 logits need an fp32 head)."""
    where = mesh.device_type if mesh is not None else next(model.parameters()).device.type
    torch_versions.require("fsdp2", where)  # an older torch on the CPU: one line, not a crash
    kwargs = {"mesh": mesh, "reshard_after_forward": reshard_after_forward}
    inner = {}
    if mp_policy is not None:
        kwargs["mp_policy"] = mp_policy       # output_dtype casts the model's output (logits)
        inner = {"mp_policy": replace(mp_policy, output_dtype=None)}  # blocks stay in bf16
    for block in model.layers:
        fully_shard(block, **{**kwargs, **inner})  # one all-gather / reduce-scatter group per block
    if head_policy is not None:
        fully_shard(model.head, **{**kwargs, "mp_policy": head_policy})
    fully_shard(model, **kwargs)              # the rest of the parameters
    return model


def build_sharded(cfg: dict, mesh, seed: int, device, meta: bool = True,
                  **shard_kwargs) -> TransformerLM:
    """A sharded TransformerLM whose weights equal ``workload.build_model(cfg, seed)``.

    meta=True: shapes on the meta device -> shard -> to_empty (allocates the shards only) ->
    init each shard. meta=False: the whole model on every rank first, then shard.
    """
    if meta:
        with torch.device("meta"):
            model = TransformerLM(**cfg)      # no memory: parameters have shapes, no storage
        shard_model(model, mesh, **shard_kwargs)
        model.to_empty(device=device)         # allocate this rank's shards, uninitialised
        init_weights(model, seed)             # fill them (one full tensor at a time)
    else:
        model = TransformerLM(**cfg).to(device)
        init_weights(model, seed)
        shard_model(model, mesh, **shard_kwargs)
    return model


def unsharded_parameter_bytes(model: nn.Module) -> int:
    """Bytes of parameters that are currently full tensors (FSDP swaps in plain tensors while a
    group is unsharded, and DTensor shards when it is resharded)."""
    from source_code.measure import is_dtensor
    return sum(p.numel() * p.element_size() for p in model.parameters()
               if not is_dtensor(p))
