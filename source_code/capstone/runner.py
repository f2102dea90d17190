"""What every configuration of the capstone provides, and the helpers they share.

A ``Runner`` trains one configuration on this rank:

* ``step(x, y)``: one training step on the global batch (x, y): the configuration cuts out its
  own piece (its samples, its tokens, its microbatches), counts the valid targets of the whole
  batch over the ranks holding other tokens (loss.global_token_count) and trains; returns the
  global loss on the ranks that know it, None elsewhere;
* ``weights()``: name -> full tensor for every parameter this rank holds (collective for
  sharded ones: every rank of the configuration calls it);
* ``kind``: which seed model and reference it is compared with ("dense" or "moe").

A builder takes a ``Spec``: the seed checkpoint, the learning rate and the dtype (fp32, or fp64
where a configuration must then agree with one process to ~1e-12).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from source_code.measure import is_dtensor


@dataclass
class Runner:
    step: Callable
    weights: Callable
    kind: str = "dense"


@dataclass(frozen=True)
class Spec:
    path: str                       # the seed checkpoint (seed.save_seed)
    lr: float
    dtype: torch.dtype = torch.float32


_MESHES: dict = {}
_GROUPS: dict = {}


def mesh(shape: tuple, names: tuple):
    """A DeviceMesh over all ranks (the last dimension varies fastest), made once per process:
    every configuration of that shape shares its process groups (making one costs a
    rendezvous of every rank)."""
    key = (dist.get_world_size(), tuple(shape), tuple(names))
    if key not in _MESHES:
        _MESHES[key] = init_device_mesh("cpu", tuple(shape), mesh_dim_names=tuple(names))
    return _MESHES[key]


def flat_group(grid, dims: tuple):
    """The process group of the ranks that differ from this one only along ``dims`` of ``grid``
    (those dimensions flattened into one, e.g. ("dp", "cp"): every rank holding other tokens),
    made once per process. Every rank makes every such group, in the same order."""
    key = (id(grid), tuple(dims))
    if key not in _GROUPS:
        names = list(grid.mesh_dim_names)
        order = [names.index(n) for n in names if n not in dims] + [names.index(d) for d in dims]
        size = 1
        for d in dims:
            size *= grid.size(names.index(d))
        mine = None
        for ranks in grid.mesh.permute(*order).reshape(-1, size).tolist():
            group = dist.new_group(ranks)
            mine = group if dist.get_rank() in ranks else mine
        _GROUPS[key] = mine
    return _GROUPS[key]


TOKEN_DIMS = ("dp", "cp", "ep")     # the mesh dimensions whose ranks read other tokens


def token_group(grid):
    """The ranks that read other tokens than this one: ``grid``'s data, context and expert
    dimensions (one of them: its own group; several: flat_group). The tensor-parallel and
    pipeline ranks of one copy read the same tokens."""
    dims = tuple(n for n in grid.mesh_dim_names if n in TOKEN_DIMS)
    return grid[dims[0]].get_group() if len(dims) == 1 else flat_group(grid, dims)


def full_weights(model) -> dict:
    """name -> full tensor (DTensors gathered: a collective on every rank of their mesh)."""
    return {n: (p.full_tensor() if is_dtensor(p) else p).detach().clone()
            for n, p in model.named_parameters()}


def sum_gradients(params, group=None) -> None:
    """Add up each gradient (its local shard for a DTensor) over ``group``: each rank's loss
    already carries 1/global count, so the pieces' gradients ADD UP to the whole batch's."""
    for p in params:
        if p.grad is not None:
            g = p.grad.to_local() if is_dtensor(p.grad) else p.grad
            dist.all_reduce(g, group=group)


def sum_and_step(loss: torch.Tensor, model, opt, group=None) -> float:
    """The end of a step whose ranks compute the whole model on their own tokens: backward,
    gradients summed over ``group`` (sum_gradients), the optimizer's step, the loss reported."""
    loss.backward()
    sum_gradients(model.parameters(), group)
    opt.step()
    opt.zero_grad()
    return report(loss, group)


def report(loss: torch.Tensor, group=None) -> float:
    """The global loss from this rank's share of it: a SUM over ``group``."""
    total = loss.detach().clone().reshape(1)
    dist.all_reduce(total, group=group)
    return total.item()


def piece(batch, index: int, n: int):
    """Piece ``index`` of ``n`` consecutive pieces of the global batch (a data-parallel slice)."""
    x, y = batch
    return x.chunk(n)[index], y.chunk(n)[index]
