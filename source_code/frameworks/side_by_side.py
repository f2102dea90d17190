"""The plain DDP script and the framework scripts in turn, in one launch: the notebook's side-by-side run.

    torchrun --standalone --nproc-per-node=2 -m source_code.frameworks.side_by_side
    torchrun --standalone --nproc-per-node=2 -m source_code.frameworks.side_by_side --epochs 4 --out-dir runs

Each process of the launch imports torch and the three frameworks once, then forks one child
per run, which calls the script's own ``main`` with its flags: exactly what ``torchrun -m SCRIPT``
would run in that process (the framework forms its process group from torchrun's variables,
trains, saves its weights, ends the group), in a fresh process that keeps nothing of the runs
before it (Accelerate, for one, keeps one state per process). What one launch saves is
starting the processes and importing torch and each framework again for every run (seconds of
CPU each).

Rank 0 prints ``run: LABEL`` before each run and ``run_seconds: S`` after it, so the output
splits into one part per run (``compare.split_runs``); each part ends with the script's own
``summary:`` line. With --out-dir every run saves its final weights there (the plain script
as its snapshot); the last line is ``summary: runs=N seconds=S``.
"""
from __future__ import annotations

import importlib
import multiprocessing
import os
import sys
import time

from source_code.cli import Parser, positive_int
from source_code.distributed import ranks_from_env
from source_code.errors import LaunchError

# label, script, extra flags: the plain script first and last (a busy neighbour slows all alike)
RUNS = [
    ("plain DDP", "source_code.training.ddp", []),
    ("Lightning", "source_code.frameworks.lightning_train", []),
    ("Accelerate", "source_code.frameworks.accelerate_train", []),
    ("Accelerate, plain batches", "source_code.frameworks.accelerate_train", ["--batches", "sampler"]),
    ("DeepSpeed ZeRO-2", "source_code.frameworks.deepspeed_train", ["--zero-stage", "2"]),
    ("DeepSpeed ZeRO-3", "source_code.frameworks.deepspeed_train", ["--zero-stage", "3"]),
    ("plain DDP again", "source_code.training.ddp", []),
]
PLAIN = "source_code.training.ddp"
LAUNCH = "torchrun --standalone --nproc-per-node=2 -m source_code.frameworks.side_by_side"


def weights_path(out_dir: str, label: str) -> str:
    return os.path.join(out_dir, label.replace(" ", "_").replace(",", "") + ".pt")


def fresh_endpoint(store, rank: int, run: int) -> str:
    """A port no earlier run used, chosen by rank 0 and read by every rank from torchrun's store
    under a key of this run's own."""
    key = f"side_by_side/run_{run}/port"
    if rank == 0:
        from source_code.distributed import free_port
        store.set(key, str(free_port()))
    return store.get(key).decode()


def _one_run(module: str, argv: list[str], port: str) -> None:
    """In the forked child: the script's main, its exit status as the child's. Its process group
    meets at a port of its own, served by rank 0 (not at torchrun's store, which still holds the
    keys of the runs before: a rank could read another run's address there)."""
    from source_code.errors import run_main
    sys.argv = [module, *argv]
    os.environ["MASTER_PORT"] = port
    os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    run_main(lambda: importlib.import_module(module).main(argv))


def preload() -> None:
    """Import once, before forking, what every run would import again (no thread started yet)."""
    import accelerate  # noqa: F401
    import deepspeed  # noqa: F401
    import lightning  # noqa: F401
    for _, module, _ in RUNS:
        importlib.import_module(module)


def main(argv=None) -> int:
    ap = Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=positive_int, default=1)
    ap.add_argument("--out-dir", default="", help="each run saves its final weights here (default: none)")
    args = ap.parse_args(argv)
    if args.out_dir and not os.path.isdir(args.out_dir):
        raise LaunchError(f"error: --out-dir {args.out_dir}: no such directory; create it first")
    rank = (ranks_from_env() or (0,))[0]
    from source_code.rendezvous import agent_store
    store = agent_store()
    if store is None:
        raise LaunchError(f"error: start it with torchrun: {LAUNCH}")
    # a framework that asks at import whether there is a GPU asks NVML, so CUDA stays unstarted
    # in this process and its forked children can use it; where CUDA started anyway, each child
    # starts afresh ("spawn": it imports again, slower, still correct)
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    preload()
    import torch
    fork = multiprocessing.get_context("spawn" if torch.cuda.is_initialized() else "fork")
    began = time.perf_counter()
    for run, (label, module, extra) in enumerate(RUNS):
        if rank == 0:
            print(f"run: {label}", flush=True)
        flag = "--checkpoint" if module == PLAIN else "--save-weights"
        save = [flag, weights_path(args.out_dir, label)] if args.out_dir else []
        start = time.perf_counter()
        child = fork.Process(target=_one_run, args=(module, ["--epochs", str(args.epochs), *save, *extra],
                                                      fresh_endpoint(store, rank, run)))
        child.start()
        child.join()
        if child.exitcode:
            return child.exitcode
        if rank == 0:
            print(f"run_seconds: {time.perf_counter() - start:.2f}", flush=True)
    if rank == 0:
        print(f"summary: runs={len(RUNS)} seconds={time.perf_counter() - began:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    from source_code.errors import run_main
    run_main(main)
