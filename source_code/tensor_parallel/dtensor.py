"""The same tensor parallelism with PyTorch's library: DTensor and ``parallelize_module``.

A plan maps module names to styles; the library cuts the weights and inserts the collectives:

* ``ColwiseParallel()``  = our ColumnParallelLinear: weight Shard(0) (rows), input Replicate,
  output Shard(-1); its backward all-reduces the input gradient (our ``copy_to_tp``).
* ``RowwiseParallel()``  = our RowParallelLinear: weight Shard(1) (columns), output Partial
  turned into Replicate by an all-reduce (our ``reduce_from_tp``), or into Shard(1) by a
  reduce-scatter with ``output_layouts=Shard(1)`` (sequence parallelism).
* ``SequenceParallel()`` = a LayerNorm on its t/n tokens, parameters replicated.
* ``PrepareModuleInput`` = the border of a region: Shard(1) -> Replicate is our all-gather.
* ``loss_parallel()``    = cross-entropy on logits sharded over the vocabulary (head
  ``ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)``): no rank ever holds
  the full (b, t, vocab) logits.

    mesh = init_device_mesh("cpu", (2,))      # "cuda" on GPUs; a 1-D mesh = one TP group
    parallelize(model, mesh, sequence_parallel=True)
"""
from __future__ import annotations

import contextlib

import torch.nn as nn

try:  # torch >= 2.5 has the public names; 2.4 kept them under _tensor
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.debug import CommDebugMode
except ImportError:  # pragma: no cover - older torch
    from torch.distributed._tensor import Replicate, Shard
    from torch.distributed._tensor.debug import CommDebugMode
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                               RowwiseParallel, SequenceParallel,
                                               loss_parallel, parallelize_module)

__all__ = ["block_plan", "parallelize", "init_device_mesh", "CommDebugMode", "loss_context"]


def block_plan(sequence_parallel: bool, shared_input: bool = True) -> dict:
    """The plan of one models.Block: q/k/v and up column-wise, o and down row-wise.

    ``shared_input``: turn the attention's input into ONE replicated DTensor before q, k and v
    read it, so their three partial input gradients are summed first and all-reduced once
    (as our TPAttention does with one copy_to_tp). Without it each ColwiseParallel wraps the
    input itself and the backward all-reduces three times."""
    if not sequence_parallel:
        plan = {"attn.wq": ColwiseParallel(), "attn.wk": ColwiseParallel(),
                "attn.wv": ColwiseParallel(), "attn.wo": RowwiseParallel(),
                "mlp.up": ColwiseParallel(), "mlp.down": RowwiseParallel()}
        if shared_input:
            plan["attn"] = PrepareModuleInput(input_layouts=(Replicate(),),
                                              desired_input_layouts=(Replicate(),))
        return plan
    gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    return {"norm1": SequenceParallel(), "attn": gather,
            "attn.wq": ColwiseParallel(), "attn.wk": ColwiseParallel(),
            "attn.wv": ColwiseParallel(), "attn.wo": RowwiseParallel(output_layouts=Shard(1)),
            "norm2": SequenceParallel(), "mlp": PrepareModuleInput(
                input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "mlp.up": ColwiseParallel(), "mlp.down": RowwiseParallel(output_layouts=Shard(1))}


def parallelize(model: nn.Module, mesh, sequence_parallel: bool = False,
                vocab_parallel_head: bool = False, shared_input: bool = True) -> nn.Module:
    """Shard a models.TransformerLM in place over the 1-D ``mesh``; returns it."""
    for block in model.layers:
        parallelize_module(block, mesh, block_plan(sequence_parallel, shared_input))
    top = {}
    if sequence_parallel:
        # the embeddings' output enters as my t/n tokens (a local slice, all-gather backward);
        # the final LayerNorm is sequence-parallel; the head gets the full sequence back
        top["layers.0"] = PrepareModuleInput(input_layouts=(Replicate(),),
                                             desired_input_layouts=(Shard(1),),
                                             use_local_output=True)
        top["norm"] = SequenceParallel()
    if vocab_parallel_head:
        top["head"] = ColwiseParallel(input_layouts=Shard(1) if sequence_parallel else Replicate(),
                                      output_layouts=Shard(-1), use_local_output=False)
    elif sequence_parallel:
        top["head"] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                         use_local_output=True)
    if top:
        parallelize_module(model, mesh, top)
    return model


def loss_context(vocab_parallel_head: bool):
    """``loss_parallel()`` around the loss and its backward when the head is vocabulary-parallel."""
    return loss_parallel() if vocab_parallel_head else contextlib.nullcontext()
