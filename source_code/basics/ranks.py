"""What rank, local rank and world size mean: every process reports who it is.

    torchrun --standalone --nproc-per-node=2 -m source_code.basics.ranks
    python -m source_code.basics.ranks --world-size 2      # starts its own processes (spawn)

Each process reads RANK / LOCAL_RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT (set by the
launcher), asks the device policy (``context()``) where it computes, and the reports are gathered on rank 0,
which prints one line per rank.
"""
from __future__ import annotations

import os

import torch.distributed as dist

from source_code.cli import Parser, positive_int
from source_code.distributed import context, print0, run_main, session

KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def report() -> dict:
    """This process's launcher variables, its device and backend, and its pid."""
    ctx = context()  # where the device policy put this process
    info = {k: os.environ.get(k) for k in KEYS}
    info.update(device=str(ctx.device), backend=ctx.backend, pid=os.getpid(),
                group_rank=dist.get_rank() if dist.is_initialized() else None)
    return info


def gather_reports() -> list[dict]:
    """Every rank's report, in rank order, on every rank (all_gather_object)."""
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, report())
    return out


def format_line(r: dict) -> str:
    return (f"RANK={r['RANK']} LOCAL_RANK={r['LOCAL_RANK']} WORLD_SIZE={r['WORLD_SIZE']} "
            f"MASTER_ADDR={r['MASTER_ADDR']} MASTER_PORT={r['MASTER_PORT']} "
            f"device={r['device']} backend={r['backend']}")


def main(argv=None):
    p = Parser(description="Every process reports its rank, local rank and device.")
    p.add_argument("--world-size", type=positive_int, default=2,
                   help="processes to start when not launched by torchrun/srun (default 2)")
    args = p.parse_args(argv)
    from source_code.distributed import ranks_from_env
    if ranks_from_env() is None:
        from source_code.processes import spawn
        for r in spawn(report, args.world_size):
            print(format_line(r), flush=True)
        return 0
    with session(launch_hint="torchrun --standalone --nproc-per-node=2 -m source_code.basics.ranks"):
        for r in gather_reports():
            print0(format_line(r))
    return 0


if __name__ == "__main__":
    run_main(main)
