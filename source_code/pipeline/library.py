"""The same pipeline with ``torch.distributed.pipelining``: PipelineStage + a schedule class.

    stages = [PipelineStage(module, stage_index, num_stages, device) for each local stage]
    schedule = ScheduleGPipe(stages[0], n_microbatches, loss_fn=...)   # or 1F1B, Interleaved...
    schedule.step(x)                                   # on the rank holding the first stage
    schedule.step(target=y, losses=losses)             # on the rank holding the last stage

The schedule cuts the whole batch into microbatches itself, sends activations and gradients
between stages and runs forwards/backwards in its order. Single-stage schedules (GPipe, 1F1B)
put one stage on each rank; multi-stage ones cut the model into 2p stages, two per rank:
looped for Interleaved1F1B (rank r holds stages r and r + p) and V-shaped for ZBVZeroBubble
(rank r holds stages r and 2p - 1 - r, so rank 0 holds the first and the last).

Schedule classes that this torch does not have (older releases), and schedules an older torch
hangs or fails in on gloo (source_code/torch_versions.py), are left out by ``available()``;
``refusal`` says why in one line.
"""
from __future__ import annotations

import inspect

import torch

from source_code import torch_versions

LIBRARY = {  # our name -> (class name in torch.distributed.pipelining, stages per rank, layout)
    "lib-gpipe": ("ScheduleGPipe", 1, "single"),
    "lib-1f1b": ("Schedule1F1B", 1, "single"),
    "lib-interleaved-1f1b": ("ScheduleInterleaved1F1B", 2, "looped"),
    "lib-zero-bubble": ("ScheduleInterleavedZeroBubble", 2, "looped"),
    "lib-zbv": ("ScheduleZBVZeroBubble", 2, "v"),
}


# what a schedule needs beyond its class (source_code/torch_versions.py: measured per torch)
NEEDS = {"lib-gpipe": "gpipe", "lib-1f1b": "pipelining", "lib-interleaved-1f1b": "pipelining",
         "lib-zero-bubble": "pipelining", "lib-zbv": "zbv"}


def _device(device):
    if device is not None:
        return device
    from source_code import device_policy, distributed
    try:
        return distributed.context().device
    except RuntimeError:  # before the group forms: what the policy would choose here
        return device_policy.choose(0, 1).device


def provided() -> list[str]:
    """The library schedules whose classes this torch has."""
    try:
        import torch.distributed.pipelining as pp
    except ImportError:
        return []
    return [name for name, (cls, _, _) in LIBRARY.items() if hasattr(pp, cls)]


def available(device=None) -> list[str]:
    """The library schedules this torch provides and runs on ``device`` (default: this process's):
    on the CPU with gloo older torches hang or fail in some (torch_versions.NEEDS)."""
    device = _device(device)
    return [n for n in provided() if n not in NEEDS or torch_versions.supported(NEEDS[n], device)]


def refusal(name: str, device=None) -> str:
    """The one line for a library schedule this torch cannot run here."""
    if name in provided() and name in NEEDS:
        return torch_versions.refusal(NEEDS[name])
    return (f"error: --schedule {name} is not in torch {torch.__version__}; choose one of "
            f"{', '.join(available(device))}")


def stage_ids(name: str, rank: int, p: int) -> list[int]:
    """The global stage indices rank ``rank`` holds, out of ``n_stages(name, p)``."""
    _, per_rank, layout = LIBRARY[name]
    if layout == "single":
        return [rank]
    if layout == "looped":
        return [rank, rank + p]
    return [rank, 2 * p - 1 - rank]


def n_stages(name: str, p: int) -> int:
    return LIBRARY[name][1] * p


def build(name: str, modules: dict, rank: int, p: int, m: int, device, loss_fn):
    """The schedule object for this rank; ``modules`` maps stage index -> nn.Module (its stages)."""
    import torch.distributed.pipelining as pp
    if name not in available():
        raise ValueError(f"schedule {name!r} is not in this torch ({torch.__version__}); "
                         f"available: {', '.join(available())}")
    cls_name, per_rank, _ = LIBRARY[name]
    total = n_stages(name, p)
    stages = [pp.PipelineStage(modules[i], i, total, device) for i in stage_ids(name, rank, p)]
    cls = getattr(pp, cls_name)
    kwargs = {"loss_fn": loss_fn}
    # our loss_fn already divides by the whole batch: the schedule must not divide by m again
    if "scale_grads" in inspect.signature(cls.__init__).parameters:
        kwargs["scale_grads"] = False
    return cls(stages[0] if per_rank == 1 else stages, m, **kwargs)


def step(schedule, name: str, rank: int, p: int, x, y) -> float | None:
    """One training step through the library schedule; the total loss where the last stage lives."""
    ids = stage_ids(name, rank, p)
    first, last = 0 in ids, n_stages(name, p) - 1 in ids
    losses: list = []
    args = (x,) if first else ()
    kwargs = {"target": y, "losses": losses} if last else {}
    schedule.step(*args, **kwargs)
    return float(sum(v.detach() for v in losses)) if last else None
