"""What a device mesh is, read from the mesh object itself.

``init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))`` ("cuda" on GPUs: the mesh's
device type is the one its ranks compute on) arranges the 4 ranks of the job in a 2 x 2 grid,
``mesh.mesh``: the last dimension varies fastest, so consecutive ranks
(the ones that share a node under torchrun/Slurm) form the "tp" groups::

    mesh.mesh = [[0, 1],      row    = one dp index, its ranks form a tp group
                 [2, 3]]      column = one tp index, its ranks form a dp group

``mesh["tp"]`` is this rank's row (a 1-D mesh with its own process group), ``mesh["dp"]`` its
column. A parameter is a DTensor with one placement per mesh dimension, e.g. an attention
weight after TP and FSDP2: (dp: _StridedShard(0), tp: Shard(0)).

``owner_map(p)`` shows where each element of a DTensor ``p`` lives: every rank fills its local
shard with its own rank number and the shards are put back together with ``full_tensor()``,
i.e. by the same collective that gathers the real weight.

``describe`` builds the mesh and the model on this rank's device (``distributed.context()``):
the CPU when notebook 12 spawns it with ``device="cpu"``, one GPU per process otherwise.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from source_code.distributed import context
from source_code.measure import DTensor


def groups(mesh_grid: torch.Tensor, dim: int) -> list[list[int]]:
    """The rank lists that form one group along mesh dimension ``dim`` (e.g. the tp groups)."""
    moved = mesh_grid.movedim(dim, -1)
    return moved.reshape(-1, moved.shape[-1]).tolist()


def owner_map(p) -> torch.Tensor:
    """A tensor of p's global shape whose every element is the rank that holds it (collective)."""
    local = torch.full_like(p.to_local(), float(dist.get_rank()))
    probe = DTensor.from_local(local, p.device_mesh, p.placements, shape=p.shape, stride=p.stride())
    return probe.full_tensor().to(torch.int64)


def slices_of(owners: torch.Tensor, rank: int) -> str:
    """The rows:cols a rank holds in a 2-D owner map, e.g. "rows 32:48, cols 0:64"."""
    rows, cols = (torch.as_tensor(owners) == rank).nonzero(as_tuple=True)
    if rows.numel() == 0:
        return "nothing"
    return (f"rows {rows.min().item()}:{rows.max().item() + 1}, "
            f"cols {cols.min().item()}:{cols.max().item() + 1}")


def describe(dp: int = 2, tp: int = 2, names=("layers.0.attn.wq.weight", "layers.0.attn.wo.weight",
                                              "layers.0.mlp.down.bias", "tok.weight")) -> dict:
    """Build a dp x tp mesh and the 2D TransformerLM on it (call on all ranks); return what
    rank 0 needs to draw them: the grid, the groups, and for each named parameter its
    placements, every rank's local shape and its owner map."""
    from source_code.mesh.parity import quiet_redistribute_warnings
    from source_code.mesh.tp import build_2d
    from source_code import workload
    quiet_redistribute_warnings()
    device = context().device
    mesh = init_device_mesh(device.type, (dp, tp), mesh_dim_names=("dp", "tp"))
    model = build_2d(workload.build_model(workload.model_config(), 0, device), mesh)
    params = dict(model.named_parameters())
    out = {"mesh": mesh.mesh.tolist(), "dim_names": list(mesh.mesh_dim_names),
           "tp_groups": groups(mesh.mesh, 1), "dp_groups": groups(mesh.mesh, 0),
           "my_coordinate": list(mesh.get_coordinate()),
           "tp_group_of_rank": mesh["tp"].mesh.tolist(), "dp_group_of_rank": mesh["dp"].mesh.tolist(),
           "params": {}}
    for name in names:
        p = params[name]
        shapes = [None] * dist.get_world_size()
        dist.all_gather_object(shapes, tuple(p.to_local().shape))
        out["params"][name] = {"shape": tuple(p.shape), "placements": [repr(x) for x in p.placements],
                               "local_shapes": shapes,
                               # numpy: pickled by value (a tensor would travel as a shared-memory
                               # handle that dies with the process that made it)
                               "owners": owner_map(p).cpu().numpy()}
    return out
