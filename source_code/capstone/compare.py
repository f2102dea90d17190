"""One configuration against one process: its loss curve and its final weights (the harness).

    refs = references(path, data, lr, dtype)       # on rank 0, sent to every rank
    row = measure(runner, data, refs)              # every rank of the configuration

``measure`` trains the runner on the same global batches, in the same order, as the
one-process reference (seed.reference), gathers its final weights to full tensors and
returns the largest differences. Used by matrix.py (every configuration) and choose.py (one).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from source_code.capstone import seed


def max_diff(got: dict, want: dict) -> float:
    """The largest |got - want| over the tensors of ``got`` (names of the one-process model);
    a name the one-process model lacks is an error."""
    unknown = sorted(set(got) - set(want))
    if unknown:
        raise AssertionError(f"weights not in the one-process model: {unknown}")
    return max(((got[n] - want[n]).abs().max().item() for n in got), default=0.0)


def check_names(held: list, want: dict) -> None:
    """The ranks' parameter names together (``held``: one collection per rank) are exactly the
    one-process model's: a runner that drops a parameter, or returns none, fails here."""
    union = set().union(*map(set, held))
    missing, unknown = sorted(set(want) - union), sorted(union - set(want))
    if missing or unknown:
        raise AssertionError(f"weights compared: no rank holds {missing}; unknown {unknown}")


def references(path, data, lr: float, dtype=torch.float32, kinds=("dense", "moe")) -> dict:
    """kind -> (losses, weights) of one process, computed on rank 0 and sent to every rank."""
    refs = [None]
    if dist.get_rank() == 0:
        refs = [{kind: seed.reference(path, data, kind, lr, dtype=dtype) for kind in kinds}]
    dist.broadcast_object_list(refs)
    return refs[0]


def measure(runner, data, refs: dict, keep: bool = False) -> dict:
    """Train ``runner`` on ``data`` (every rank); its loss curve and its largest differences
    from the one-process reference of its kind (``refs[kind]`` = (losses, weights))."""
    losses = [runner.step(x, y) for x, y in data]
    weights = runner.weights()
    ref_losses, ref_weights = refs[runner.kind]
    held = [None] * dist.get_world_size()
    dist.all_gather_object(held, sorted(weights))
    check_names(held, ref_weights)                   # every rank raises alike: no hang
    diff = torch.tensor([max_diff(weights, ref_weights)], dtype=torch.float64)
    dist.all_reduce(diff, op=dist.ReduceOp.MAX)
    curves = [None] * dist.get_world_size()
    dist.all_gather_object(curves, losses if losses[0] is not None else None)
    curve = next(c for c in curves if c is not None)
    return {"kind": runner.kind, "losses": curve, "param_diff": diff.item(),
            "loss_diff": max(abs(a - b) for a, b in zip(curve, ref_losses, strict=True)),
            "weights": weights if keep else None}
