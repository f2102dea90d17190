"""What needs which torch: one place, and a one-line refusal at start instead of a hang.

    python -m source_code.torch_versions          # what this torch can and cannot run here

The clusters' modules ship torch 2.6-2.11; the workshop pins 2.14.1. Each row of ``NEEDS``
was found by running the entry points under some of those versions (``make torch-check
TORCH=...``, source_code/torch_support.py) and names the first of them where the feature works (and the later ones that break it). Some
limits hold on the CPU with gloo only (``cpu_only``): on GPUs with NCCL the same torch works.
A script calls ``require(feature, device)`` before any work; an older torch stops it with one
line naming the version it needs and why (exit status 2, as every launch error here).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from source_code.errors import LaunchError


@dataclass(frozen=True)
class Need:
    version: tuple[int, int]
    cpu_only: bool
    what: str
    why: str
    broken: tuple[tuple[int, int], ...] = ()   # newer versions that fail it all the same


# measured on the CPU with gloo (make torch-check) under 2.6.0, 2.7.1, 2.8.0, 2.9.1, 2.10.0, 2.11.0,
# 2.12.1 and the pinned 2.14.1: every minor version the clusters ship and the ones after
_GLOO_29 = ("2.9's pipeline stages send a message gloo receives in another size than it expects, "
            "and both ranks abort ('Received data size doesn't match expected size')")
NEEDS = {
    "fsdp2": Need((2, 9), True, "FSDP2 (fully_shard) on the CPU",
                  "2.6's FSDP2 records stream events its CPU stream lacks, 2.7's and 2.8's give gradients "
                  "off by 5e-4 (a 2D mesh's by 0.08) and 2.7's cannot run HSDP on gloo (ReduceOp.AVG)"),
    "gpipe": Need((2, 6), True, "torch.distributed.pipelining's PipelineStage and ScheduleGPipe on gloo",
                  _GLOO_29, broken=((2, 9),)),
    "pipelining": Need((2, 8), True, "torch.distributed.pipelining's 1F1B, interleaved and zero-bubble "
                       "schedules on gloo", "2.6's and 2.7's wait on one operation of a batched send/recv, "
                       "which gloo never completes: the step hangs; " + _GLOO_29, broken=((2, 9),)),
    "zbv": Need((2, 12), True, "torch.distributed.pipelining's ScheduleZBVZeroBubble on gloo",
                "2.8's to 2.11's V-shaped schedule sends between ranks gloo has not connected "
                "('Pair is not connected')"),
    "flight-recorder": Need((2, 8), True, "the flight recorder of gloo collectives",
                            "2.6 and 2.7 record nothing for gloo, so a hang's mismatch cannot be located"),
}


def version() -> tuple[int, int]:
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def supported(feature: str, device="cpu") -> bool:
    need = NEEDS[feature]
    on_cpu = device != "auto" and torch.device(device).type == "cpu"  # "auto": processes.spawn's GPU choice
    works = version() >= need.version and version() not in need.broken
    return works or (need.cpu_only and not on_cpu)


def refusal(feature: str) -> str:
    need = NEEDS[feature]
    where = " (GPUs with NCCL run it on this torch)" if need.cpu_only else ""
    wanted = f"{need.version[0]}.{need.version[1]} or newer" + "".join(
        f" but {major}.{minor}" for major, minor in need.broken)
    return (f"error: {need.what}: needs torch {wanted}, this is {torch.__version__}{where}: {need.why}; "
            "load another PyTorch module or use the workshop's environment (make venv)")


def require(feature: str, device="cpu") -> None:
    """Stop with one line (LaunchError, exit 2) where this torch cannot run ``feature`` here."""
    if not supported(feature, device):
        raise LaunchError(refusal(feature))


def main() -> int:
    print(f"torch {torch.__version__}")
    for feature, need in NEEDS.items():
        ok = supported(feature, "cpu")
        print(f"{feature:<12} {'ok' if ok else 'needs ' + '.'.join(map(str, need.version))}  {need.what}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
