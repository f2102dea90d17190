"""Where a process computes, and which backend its collectives use: the workshop's one policy.

    python -m source_code.device_policy                    # what this machine would choose, and why
    python -m source_code.device_policy --local-world-size 4

The rules, in the order they are applied (``choose``):

1. ``WORKSHOP_DEVICE=cpu`` asks for the CPU on purpose: CPU + gloo. Demos about an algorithm
   rather than the hardware use it (``processes.spawn(..., device="cpu")``).
2. A GPU node whose CUDA does not start (Slurm or ``*_VISIBLE_DEVICES`` announce GPUs, but
   ``torch.cuda.is_available()`` is False: a wheel for another CUDA, an old driver): an error
   naming the fix. Never a silent CPU run on a GPU node.
3. A GPU the installed torch build has no kernels for (a V100 is sm_70; CUDA 13 builds such as
   the pinned wheel start at sm_75): an error naming the fix, instead of "no kernel image".
4. At most one process per GPU on this node: ``cuda:LOCAL_RANK`` (``cuda:0`` when each process
   sees exactly its own GPU, as with ``srun --gpus-per-task=1``), and the mixed backend
   ``cpu:gloo,cuda:nccl``: CUDA tensors go through NCCL, CPU tensors (a loss to report, a
   check's result) through gloo, in one process group.
5. More processes on this node than GPUs (a laptop with one GPU running a 4-process demo):
   CPU + gloo for all of them, said in one line. Two ranks never share a GPU under NCCL.
6. No CUDA: CPU + gloo. (ROCm GPUs count as CUDA in PyTorch: same rules, RCCL behind "nccl".)
"""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

import torch

from source_code.errors import LaunchError, run_main

MIXED = "cpu:gloo,cuda:nccl"
VISIBLE = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


class DeviceError(LaunchError):
    """A GPU node that cannot be used as it is: one line naming the fix (exit status 2)."""

    def __init__(self, message: str):
        super().__init__(message, every_rank=True)


@dataclass(frozen=True)
class Gpus:
    """What torch sees of the GPUs; ``Gpus.probe()`` asks torch, tests build their own."""

    available: bool
    count: int = 0
    capability: tuple[int, int] | None = None  # of the first visible GPU
    name: str = ""
    arch_list: tuple[str, ...] = ()           # what the torch build has kernels for
    hip: bool = False

    @staticmethod
    def probe() -> "Gpus":
        if not torch.cuda.is_available():
            return Gpus(False)
        return Gpus(True, torch.cuda.device_count(), torch.cuda.get_device_capability(0),
                    torch.cuda.get_device_name(0), tuple(torch.cuda.get_arch_list()),
                    torch.version.hip is not None)


@dataclass(frozen=True)
class Placement:
    device: torch.device
    backend: str      # "gloo" or "cpu:gloo,cuda:nccl"
    note: str = ""    # one line to print (on rank 0) when the policy fell back to the CPU


def gpus_announced(env) -> str:
    """The variable that says this node has GPUs for us (e.g. 'SLURM_GPUS_ON_NODE=4'), or ''."""
    for key in ("SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS"):
        value = env.get(key, "").strip()
        if value and value not in ("0", "none"):
            return f"{key}={value}"
    for key in VISIBLE:  # "" and "-1" hide every GPU on purpose; NoDevFiles: Slurm gave none
        value = env.get(key, "").strip()
        if value and value not in ("-1", "NoDevFiles"):
            return f"{key}={value}"
    return ""


def build_runs_on(capability: tuple[int, int], arch_list) -> bool:
    """Can a build with these arches (``sm_80``, ``compute_90``...) run a GPU of this capability?

    Kernels for sm_Xy run on sm_Xz with z >= y (same major); PTX (compute_XY) is compiled at
    load time for any newer GPU."""
    major, minor = capability
    for arch in arch_list:
        kind, _, num = arch.partition("_")
        if not num.isdigit() or len(num) < 2:
            continue
        a_major, a_minor = int(num[:-1]), int(num[-1])
        if kind == "sm" and a_major == major and a_minor <= minor:
            return True
        if kind == "compute" and (a_major, a_minor) <= (major, minor):
            return True
    return False


def _one_gpu_per_process(env, local_rank: int) -> bool:
    """Each process sees only its own GPU (srun --gpus-per-task, or a select-GPU wrapper that
    sets *_VISIBLE_DEVICES to the local rank, as LUMI documents)."""
    if env.get("SLURM_GPUS_PER_TASK"):
        return True
    return any(env.get(k, "").strip() == str(local_rank) for k in VISIBLE) and local_rank > 0


def choose(local_rank: int = 0, local_world_size: int = 1, env=None, gpus: Gpus | None = None) -> Placement:
    """Apply the rules of the module docstring; raise DeviceError where a GPU node is unusable."""
    env = os.environ if env is None else env
    want = env.get("WORKSHOP_DEVICE", "auto").strip().lower()
    if want not in ("auto", "cpu", "cuda"):
        raise DeviceError(f"error: WORKSHOP_DEVICE={want!r}; use auto, cpu or cuda")
    cpu = torch.device("cpu")
    if want == "cpu":
        return Placement(cpu, "gloo")
    gpus = Gpus.probe() if gpus is None else gpus
    if not gpus.available:
        announced = gpus_announced(env)
        if announced or want == "cuda":
            why = f"this node has GPUs ({announced})" if announced else "WORKSHOP_DEVICE=cuda"
            raise DeviceError(
                f"error: {why} but torch {torch.__version__} cannot start CUDA "
                f"(built for CUDA {torch.version.cuda or torch.version.hip or 'none'}; the driver may be "
                "older): load the site's PyTorch module or install a torch wheel built for this "
                "node's CUDA; WORKSHOP_DEVICE=cpu runs on the CPU on purpose")
        return Placement(cpu, "gloo")
    if gpus.capability and gpus.arch_list and not gpus.hip and not build_runs_on(gpus.capability, gpus.arch_list):
        sm = "sm_%d%d" % gpus.capability
        raise DeviceError(
            f"error: {gpus.name} ({sm}) is not supported by this torch build (CUDA "
            f"{torch.version.cuda}, kernels for {', '.join(gpus.arch_list)}): load the site's "
            f"PyTorch module or install a wheel whose CUDA still supports {sm} (CUDA 12.x for sm_70)")
    if gpus.count >= local_world_size:
        return Placement(torch.device("cuda", local_rank), MIXED)
    if gpus.count == 1 and _one_gpu_per_process(env, local_rank):
        return Placement(torch.device("cuda", 0), MIXED)
    return Placement(cpu, "gloo",
                     f"note: {local_world_size} processes on this node but {gpus.count} GPU(s): "
                     "all of them compute on the CPU with gloo (NCCL needs one GPU per process; "
                     f"use --nproc-per-node={gpus.count} to train on the GPUs)")


def local_world_size(env, world_size: int) -> int:
    """How many processes of the job run on this node (torchrun, srun or spawn say so)."""
    if env.get("LOCAL_WORLD_SIZE"):
        return int(env["LOCAL_WORLD_SIZE"])
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    if per_node and "SLURM_STEP_NUM_TASKS" in env:  # e.g. "4(x2)" or "3,1": expand, pick ours
        counts = []
        for part in per_node.split(","):
            n, _, rep = part.partition("(x")
            counts += [int(n)] * (int(rep.rstrip(")")) if rep else 1)
        node = int(env.get("SLURM_NODEID", 0))
        return counts[node] if node < len(counts) else counts[-1]
    return world_size


def exact_math() -> str:
    """Bitwise-reproducible GPU math for parity checks: no TF32, deterministic cuDNN.

    On Ampere and newer, TF32 matmuls and convolutions round inputs to 10 mantissa bits
    (errors ~1e-3), and cuDNN picks algorithms by timing: both break a 1e-5 comparison
    with a one-process reference. Returns the sentence the checks print."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    return "exact math: TF32 off, deterministic cuDNN"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--local-rank", type=int, default=0)
    p.add_argument("--local-world-size", type=int, default=1)
    args = p.parse_args(argv)
    gpus = Gpus.probe()
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda}, HIP {torch.version.hip}); "
          f"GPUs visible: {gpus.count}{' ' + gpus.name if gpus.name else ''}; "
          f"announced: {gpus_announced(os.environ) or 'none'}")
    try:
        placed = choose(args.local_rank, args.local_world_size, gpus=gpus)
    except DeviceError as err:
        print(err.message)
        return 2
    print(f"local rank {args.local_rank} of {args.local_world_size}: device {placed.device}, "
          f"backend {placed.backend}" + (f"\n{placed.note}" if placed.note else ""))
    return 0


if __name__ == "__main__":
    run_main(main)
