"""Corruption in the computation: validate each rank's gradient, replay the step to attribute it.

    python -m source_code.resilience.sdc_drill --world-size 3 --fault compute-repeat --rank 1 --at-step 6

A fault in one rank's forward or backward (a bad ALU, a kernel that miscomputes on one GPU)
leaves a wrong gradient that the all-reduce averages into every replica: the replicas stay
bitwise equal, so comparing their checksums (sdc.py) finds nothing. Megatron-LM's rerun state
machine (megatron/core/rerun_state_machine.py) checks a *result* instead and replays the step:
* ``is_unexpectedly_large``: each rank's local gradient norm, before the all-reduce, against
  ``threshold`` x the largest value seen before, after ``warmup`` values. Megatron's rule (its
  ``is_unexpectedly_large``, for spiky losses and gradients) differs in two ways that a drill of
  a few steps cannot copy: it flags nothing while it collects its first ``num_samples`` (100)
  values and compares with the largest of those only; and it ignores NaN and Inf, which Megatron
  rejects with validation calls of their own (this function flags them too);
* ``attribute``: every rank goes back to the state before the step (the copy the check keeps)
  and computes its slice again on the *same device*; if the flagged value does not come back
  the fault was transient. If it does, the flagged slice is computed on *another device*
  (each rank takes its neighbour's slice): a different value there means the first device
  computes wrongly (persistent: a suspect, for the diagnostic suites, not a sure verdict); the
  same value means the result was right and the cause is the data or the code, not the hardware.
"The same" is within a relative tolerance (``same``): Megatron asks for a deterministic control
flow (the same validations in the same order when the step runs again), not for deterministic
kernels, and compares with a 0.1 % tolerance (its mode that reports determinism statistics
measures the run-to-run spread, to choose one). Megatron's second replay restarts the job from
a checkpoint on another GPU; in data parallelism every rank holds the same state, so a neighbour
can compute the slice at once.
"""
from __future__ import annotations

import math

import torch.distributed as dist

from source_code.resilience.common import gather_floats


def local_grad_norm(model) -> float:
    """The L2 norm of this rank's gradients before they are averaged."""
    return math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in model.parameters()))


def is_unexpectedly_large(value: float, seen: list[float], threshold: float = 10.0, warmup: int = 2) -> bool:
    """NaN, Inf, or at least ``threshold`` x the largest earlier value, after ``warmup`` values
    (Megatron: the largest of its first 100, and NaN/Inf checked by a validation of their own)."""
    if math.isnan(value) or math.isinf(value):
        return True
    return len(seen) >= warmup and value >= threshold * max(seen)


def same(a: float, b: float, tolerance: float = 1e-3) -> bool:
    """Reproduced within a relative tolerance (Megatron allows 0.1 % for non-deterministic kernels)."""
    return a == b or abs(a - b) <= tolerance * max(abs(a), abs(b))


def verdict(initial: float, same_device: float, other_device: float | None) -> str:
    if not same(initial, same_device):
        return "transient"                   # not reproduced on the same device
    if other_device is not None and not same(initial, other_device):
        return "persistent"                  # reproduced there, not elsewhere: that device
    return "correct"                         # reproduced on another device: data or code


def attribute(replay, initial: list[float], flagged: int, group=None) -> str:
    """``replay(shift)``: every rank restores the state before the step and returns the local
    gradient norm of the slice of rank ``(rank - shift) % world``: shift 0 its own slice, shift 1
    its left neighbour's. Returns the verdict for rank ``flagged``'s slice."""
    world = dist.get_world_size(group)
    own_slices = gather_floats(replay(0), group)
    on_same_device = own_slices[flagged]
    if not same(initial[flagged], on_same_device):
        return verdict(initial[flagged], on_same_device, None)
    neighbours_slices = gather_floats(replay(1), group)
    on_other_device = neighbours_slices[(flagged + 1) % world]     # the rank that replayed flagged's slice
    return verdict(initial[flagged], on_same_device, on_other_device)
