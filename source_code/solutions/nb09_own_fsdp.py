"""Reference solutions for notebook 09's FSDP-by-hand exercises, checked by tests/test_sharding_own_fsdp_exercise.py.

    python -m pytest tests/test_sharding_own_fsdp_exercise.py

``unshard`` and ``after_forward`` run with the check's tools in scope (own_fsdp_core_exercise.py:
``gather``, ``free_storage``), as the notebook's cell has them imported.
"""
import torch
import torch.distributed as dist

from source_code.sharding.own_fsdp_core_exercise import free_storage, gather


def unshard(unit):
    """Forward pre-hook: the unit's full parameters, just before it computes."""
    gather(unit)


def after_forward(unit, out):
    """Forward post-hook: free them, and gather them again when the backward reaches the unit."""
    free_storage(unit.full)
    out.register_hook(lambda grad: gather(unit))   # the output's gradient arrives first
    return out


def reduce_grad(flat_grad):
    """This rank's (c,) fp32 chunk of the mean over ranks of the (n,) bf16 ``flat_grad``,
    zero-padded, the ranks' gradients added in fp32."""
    world = dist.get_world_size()
    c = -(-flat_grad.numel() // world)                                   # ceil(n / N)
    grad = flat_grad.float()                                             # before the wire: added in fp32
    padded = torch.cat([grad, grad.new_zeros(c * world - grad.numel())])  # (N * c,)
    mine = grad.new_empty(c)                                             # (c,) fp32
    dist.reduce_scatter_tensor(mine, padded, op=dist.ReduceOp.SUM)
    return mine / world
