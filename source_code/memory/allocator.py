"""On a GPU: reserved vs allocated memory, fragmentation, and ``expandable_segments``.

    python -m source_code.memory.allocator            # on a GPU: both allocator settings; on the CPU a one-line skip
    python -m source_code.memory.allocator --steps 12 --base-mib 256

``torch.cuda.memory_allocated`` counts the bytes of live tensors; ``memory_reserved`` what the
CUDA caching allocator holds from the driver: freed blocks stay reserved, to be handed out again
without a slow cudaMalloc. Requests of growing sizes (a sequence length or batch that grows,
variable-size all-to-all buffers) with a small tensor kept between them leave segments that no
later, larger request fits: each takes a new segment, and reserved grows past allocated
(fragmentation; an out-of-memory error can then report GBs "reserved but unallocated").
``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` lets a segment grow by mapping more
physical pages behind one virtual range, so a larger request extends the segment and the freed
pages are reused: reserved stays near the allocated peak. The setting is read when CUDA starts,
so each setting runs in its own process here.

A GPU's memory also holds what no tensor counts: the CUDA context (a few hundred MiB per
process), cuBLAS workspaces, and NCCL's buffers per communicator (``nvidia-smi`` shows them,
``memory_reserved`` does not). On the CPU none of this exists: the notebook prints a skip line.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import torch

from source_code.cli import Parser, positive_int
from source_code.distributed import pick_device

SETTINGS = ("default", "expandable_segments:True")
MIB = 2 ** 20


def growing_requests(device, steps: int = 8, base_mib: int = 64) -> dict:
    """Requests of base, base + 8, base + 16 ... MiB, each freed after a 2 MiB tensor that stays
    is allocated: {"allocated_peak", "reserved_peak", "reserved_end"} in bytes."""
    torch.cuda.reset_peak_memory_stats(device)
    keep = []
    for i in range(steps):
        big = torch.empty((base_mib + 8 * i) * MIB, dtype=torch.uint8, device=device)
        keep.append(torch.empty(2 * MIB, dtype=torch.uint8, device=device))   # stays
        del big
    torch.cuda.synchronize(device)
    return {"allocated_peak": torch.cuda.max_memory_allocated(device),
            "reserved_peak": torch.cuda.max_memory_reserved(device),
            "reserved_end": torch.cuda.memory_reserved(device)}


def compare(steps: int = 8, base_mib: int = 64) -> dict | None:
    """{setting: growing_requests(...)}, each in a fresh process; None without a GPU."""
    if pick_device()[0].type != "cuda":
        return None
    out = {}
    for setting in SETTINGS:
        env = dict(os.environ)
        if setting == "default":
            env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        else:
            env["PYTORCH_CUDA_ALLOC_CONF"] = setting
        r = subprocess.run([sys.executable, "-m", "source_code.memory.allocator", "--child",
                            "--steps", str(steps), "--base-mib", str(base_mib)],
                           env=env, capture_output=True, text=True, check=True)
        out[setting] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


def lines(runs: dict | None) -> list[str]:
    """What the notebook and the entry point print of compare(): one line per setting, or one skip line."""
    if runs is None:
        return ["allocator: skipped (no GPU here: reserved vs allocated is the CUDA caching allocator's; "
                "python -m source_code.memory.allocator on a GPU node)"]
    return [f"allocator: setting={s} allocated_peak_mib={r['allocated_peak'] / MIB:.0f} "
            f"reserved_peak_mib={r['reserved_peak'] / MIB:.0f} "
            f"reserved_over_allocated={r['reserved_peak'] / r['allocated_peak']:.2f}" for s, r in runs.items()]


def main(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=positive_int, default=8, help="requests of growing size")
    p.add_argument("--base-mib", type=positive_int, default=64, help="the first request's MiB (+8 each step)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)   # one setting, in this process
    args = p.parse_args(argv)
    if args.child:
        device = pick_device()[0]
        print(json.dumps(growing_requests(device, args.steps, args.base_mib)))
        return 0
    runs = compare(args.steps, args.base_mib)
    for line in lines(runs):
        print(line, flush=True)
    if runs is not None:
        d, e = runs["default"], runs["expandable_segments:True"]
        print(f"summary: default_reserved_over_allocated={d['reserved_peak'] / d['allocated_peak']:.2f} "
              f"expandable_reserved_over_allocated={e['reserved_peak'] / e['allocated_peak']:.2f}")
    return 0


if __name__ == "__main__":
    from source_code.errors import run_main
    run_main(main)
