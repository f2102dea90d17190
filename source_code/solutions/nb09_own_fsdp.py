"""Reference solution for notebook 09's FSDP-by-hand exercise, checked by tests/test_sharding_own_fsdp_exercise.py.

    python -m pytest tests/test_sharding_own_fsdp_exercise.py
"""
import torch
import torch.distributed as dist


def reduce_grad(flat_grad):
    """This rank's (c,) chunk of the mean over ranks of the (n,) ``flat_grad``, zero-padded."""
    world = dist.get_world_size()
    c = -(-flat_grad.numel() // world)                                   # ceil(n / N)
    padded = torch.cat([flat_grad, flat_grad.new_zeros(c * world - flat_grad.numel())])  # (N * c,)
    mine = flat_grad.new_empty(c)                                        # (c,)
    dist.reduce_scatter_tensor(mine, padded, op=dist.ReduceOp.SUM)
    return mine / world
