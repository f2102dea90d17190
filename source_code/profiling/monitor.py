"""Watching a running job: GPU utilisation, and rank 0's progress with its throughput.

* ``gpu_utilisation()`` asks ``nvidia-smi`` (NVIDIA) or ``rocm-smi`` (AMD) for every GPU's
  busy percentage and memory; where neither exists it says "not available here" and why.
* ``Progress`` prints on rank 0 only: a bar redrawn in place when stdout is a terminal, a
  plain line every few steps otherwise (a Slurm log or a notebook cell would fill up with bars).
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import time

NVIDIA = ["nvidia-smi", "--query-gpu=index,name,utilization.gpu,memory.used,memory.total",
          "--format=csv,noheader,nounits"]
ROCM = ["rocm-smi", "--showuse", "--showmemuse", "--csv"]


def gpu_utilisation(timeout: float = 10) -> str:
    """One line per GPU from nvidia-smi / rocm-smi, or a sentence saying why there is none."""
    for cmd in (NVIDIA, ROCM):
        if shutil.which(cmd[0]) is None:
            continue
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"not available here: {cmd[0]} did not answer ({exc})"
        if res.returncode != 0:
            return f"not available here: {cmd[0]} failed ({(res.stderr or res.stdout).strip()[:200]})"
        if cmd is NVIDIA:
            return "\n".join(_nvidia_line(ln) for ln in res.stdout.strip().splitlines())
        return res.stdout.strip()
    return ("not available here: neither nvidia-smi nor rocm-smi is on PATH (no GPU driver on "
            "this machine); on a GPU node run `watch -n 1 nvidia-smi` next to the job")


def _nvidia_line(line: str) -> str:
    idx, name, util, used, total = (f.strip() for f in line.split(","))
    return f"GPU {idx} ({name}): {util} % busy, {used} / {total} MiB"


class Progress:
    """Rank 0's progress: ``update(step, samples)`` after each step, ``close()`` at the end."""

    def __init__(self, total: int, enabled: bool = True, every: int = 10, width: int = 30,
                 stream=None):
        self.total, self.enabled, self.every, self.width = total, enabled, every, width
        self.stream = stream or sys.stdout
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.start = time.perf_counter()

    def line(self, step: int, samples: int) -> str:
        rate = samples / max(time.perf_counter() - self.start, 1e-9)
        return f"step {step}/{self.total}  {rate:,.0f} samples/s"

    def update(self, step: int, samples: int) -> None:
        if not self.enabled:
            return
        if self.tty:
            done = int(self.width * step / max(self.total, 1))
            bar = "#" * done + "-" * (self.width - done)
            self.stream.write(f"\r[{bar}] {self.line(step, samples)}")
            self.stream.flush()
        elif step % self.every == 0 or step == self.total:
            print(self.line(step, samples), file=self.stream, flush=True)

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()
