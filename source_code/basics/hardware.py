"""What this machine has: CPU cores, memory, torch and CUDA versions, GPUs, GPU topology.

    python -m source_code.basics.hardware

``describe()`` returns the facts as a dict (the notebook prints and checks them);
``topology()`` returns ``nvidia-smi topo -m`` output, or a sentence saying why there is none.
"""
from __future__ import annotations

import os
import platform
import shutil
import subprocess

import torch
import torch.distributed as dist

from source_code.cli import Parser


def memory_gib() -> float | None:
    """Total RAM in GiB from /proc/meminfo (Linux), None elsewhere."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return None


def usable_cores() -> int:
    """Cores this process may run on (the Slurm/cgroup allocation), not all cores of the node."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS / Windows
        return os.cpu_count() or 1


def gpus() -> list[dict]:
    """One dict per visible CUDA (or ROCm) device: index, name, memory in GiB, SM count."""
    out = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            out.append({"index": i, "name": p.name, "memory_gib": p.total_memory / 2**30,
                        "multiprocessors": p.multi_processor_count})
    return out


# how GPUs, NICs and CPUs connect: NVIDIA's tool, then AMD's (LUMI's MI250X GCDs)
TOPOLOGY_TOOLS = (("nvidia-smi", ["topo", "-m"]), ("rocm-smi", ["--showtopo"]))


def topology() -> str:
    """``nvidia-smi topo -m`` or ``rocm-smi --showtopo``, or why neither is available."""
    for tool, args in TOPOLOGY_TOOLS:
        exe = shutil.which(tool)
        if exe is None:
            continue
        res = subprocess.run([exe, *args], capture_output=True, text=True, timeout=60)
        if res.returncode != 0:
            return f"{tool} {' '.join(args)} failed (exit {res.returncode}): {res.stderr.strip()}"
        return res.stdout.rstrip()
    return ("neither nvidia-smi nor rocm-smi found: no GPU driver on this machine, so there is "
            "no GPU topology to show (processes talk through shared memory / loopback TCP)")


def describe() -> dict:
    """The facts a distributed-training user checks first, as plain Python values."""
    return {
        "hostname": platform.node(),
        "python": platform.python_version(),
        "cpu_cores_total": os.cpu_count(),
        "cpu_cores_usable": usable_cores(),
        "memory_gib": memory_gib(),
        "torch": torch.__version__,
        "torch_built_with_cuda": torch.version.cuda,  # None for a CPU-only or ROCm build
        "torch_built_with_rocm": torch.version.hip,   # ROCm builds: GPUs still say "cuda"
        "cuda_available": torch.cuda.is_available(),
        "gpus": gpus(),
        "backends": {"gloo": dist.is_gloo_available(), "nccl": dist.is_nccl_available(),
                     "mpi": dist.is_mpi_available()},
        "torch_threads": torch.get_num_threads(),
    }


def _gpu_build(info: dict) -> str:
    if info.get("torch_built_with_rocm"):
        return f"ROCm {info['torch_built_with_rocm']} (its GPUs appear as torch 'cuda' devices)"
    return f"CUDA {info['torch_built_with_cuda']}" if info["torch_built_with_cuda"] else "no GPU support"


def format_report(info: dict) -> str:
    mem = f"{info['memory_gib']:.1f} GiB" if info["memory_gib"] else "unknown"
    lines = [
        f"host            {info['hostname']}",
        f"CPU cores       {info['cpu_cores_usable']} usable of {info['cpu_cores_total']}",
        f"memory          {mem}",
        f"python / torch  {info['python']} / {info['torch']}",
        f"torch GPU       built with "
        f"{_gpu_build(info)}; available: {info['cuda_available']}",
        "backends        " + ", ".join(k for k, v in info["backends"].items() if v),
    ]
    if info["gpus"]:
        for g in info["gpus"]:
            unit = "CUs" if info.get("torch_built_with_rocm") else "SMs"
            lines.append(f"GPU {g['index']}           {g['name']}, {g['memory_gib']:.1f} GiB, "
                         f"{g['multiprocessors']} {unit}")
    else:
        lines.append("GPUs            none visible: training runs on the CPU with gloo")
    return "\n".join(lines)


def main(argv=None):
    Parser(description=__doc__.splitlines()[0]).parse_args(argv)
    print(format_report(describe()))
    print()
    print(topology())
    return 0


if __name__ == "__main__":
    from source_code.distributed import run_main
    run_main(main)
