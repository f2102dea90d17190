"""Where a tensor-parallel group may live: inside one node.

Tensor parallelism all-reduces (or all-gathers and reduce-scatters) an activation twice per
block, forward and backward: the most frequent messages of a training step, each on the
critical path. Over NVLink/Infinity Fabric inside a node they cost microseconds; across the
network between nodes, many times more. So a TP group is a set of ranks of ONE node: with
torchrun or Slurm the consecutive ranks ``k * tp ... k * tp + tp - 1``, which share a node
when ``tp`` divides the processes per node.

    from source_code.tensor_parallel.placement import check_tp_in_node
    check_tp_in_node(tp=4, world=8)        # LaunchError when 4 does not divide the local processes

Used by ``tensor_parallel.train`` (TP over every rank: one node only) and ``mesh.train_2d``
(TP on the "tp" dimension, FSDP across the nodes), before the process group forms.
"""
from __future__ import annotations

import os

from source_code import device_policy
from source_code.errors import LaunchError


def check_tp_in_node(tp: int, world: int, env=None, what: str | None = None,
                     fix: str | None = None) -> int:
    """The processes per node, or a one-line LaunchError when TP groups of ``tp`` consecutive
    ranks would cross a node boundary. ``what`` names the group in the message (default
    ``--tp N``), ``fix`` says what to do instead (default: a --tp that divides the node)."""
    env = os.environ if env is None else env
    local = device_policy.local_world_size(env, world)
    if local % tp:
        raise LaunchError(f"error: {what or f'--tp {tp}'} would span nodes ({local} processes per "
                          f"node) and TP belongs on a node's fast links; "
                          f"{fix or f'use a --tp that divides {local}'}")
    return local
