"""What each launcher tells a process: the variables a rank reads to find its place in the job.

    torchrun --standalone --nproc-per-node=2 -m source_code.launch.whoami
    srun --nodes=2 --ntasks-per-node=1 python -m source_code.launch.whoami     # in an allocation
    python -m source_code.launch.whoami --spawn 2                          # torch.multiprocessing.spawn

Unlike the training scripts, every process prints its own line here (that is the point): one
JSON object with RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, the Slurm and Open MPI
counterparts, the host name, and what source_code.distributed.ranks_from_env makes of them.
No process group is created: this only reads the environment.
"""
from __future__ import annotations

import json
import os
import socket

from source_code.cli import Parser, nonnegative_int
from source_code.errors import run_main

KEYS = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
        "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_NODEID",
        "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE"]


def environment(spawn_index: int | None = None) -> dict:
    from source_code.distributed import ranks_from_env
    found = ranks_from_env()
    return {"host": socket.gethostname(), "spawn_index": spawn_index,
            **{k: os.environ.get(k) for k in KEYS},
            "ranks_from_env": None if found is None else dict(zip(
                ("rank", "local_rank", "world_size", "launcher"), found))}


def _spawned(index: int, queue) -> None:
    queue.put(environment(index))


def spawn_environments(nprocs: int = 2) -> list[dict]:
    """torch.multiprocessing.spawn: the function gets its index as first argument, nothing else."""
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(_spawned, args=(queue,), nprocs=nprocs, start_method="spawn")
    return sorted((queue.get() for _ in range(nprocs)), key=lambda e: e["spawn_index"])


def parse(text: str) -> list[dict]:
    """The JSON lines of a whoami run (other output, e.g. torchrun's banner, is skipped)."""
    decoder, found = json.JSONDecoder(), []
    start = text.find('{"host"')
    while start != -1:  # scan the text, not lines: two ranks' lines may share one
        entry, end = decoder.raw_decode(text, start)
        found.append(entry)
        start = text.find('{"host"', end)
    return sorted(found, key=lambda e: (e["ranks_from_env"] or {}).get("rank", e["spawn_index"] or 0))


def main(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--spawn", type=nonnegative_int, default=0, help="start N processes with torch.multiprocessing.spawn")
    a = p.parse_args(argv)
    for env in (spawn_environments(a.spawn) if a.spawn else [environment()]):
        print(json.dumps(env) + "\n", end="", flush=True)  # one write: lines stay whole
    return 0


if __name__ == "__main__":
    run_main(main)
