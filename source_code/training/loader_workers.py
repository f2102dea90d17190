"""DataLoader workers started by fork or by spawn: what each costs to start, and what breaks.

    python -m source_code.training.loader_workers --workers 2

``fork`` (Linux's default) copies the running process: a worker is ready in milliseconds and
sees everything the parent has, including state that must not be copied (a CUDA context the
worker then touches fails with "Cannot re-initialize CUDA in forked subprocess"; some network
and I/O libraries are not fork-safe either). ``spawn`` starts a fresh interpreter per worker:
safe, but each worker imports torch again before its first batch, and the dataset travels by
pickle, so its class must be importable from a module (one defined in a notebook cell is not).
Some sites' guides ask for spawn (``multiprocessing_context="spawn"`` on the DataLoader, or
``torch.multiprocessing.set_start_method("spawn")``); ``persistent_workers=True`` pays the
start once per run instead of once per epoch.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time

from torch.utils.data import DataLoader

from source_code import data
from source_code.cli import positive_int
from source_code.errors import run_main

CONTEXTS = ("fork", "spawn")


def first_batch_seconds(dataset, context: str, workers: int = 2, batch_size: int = 64,
                        epochs: int = 1, persistent: bool = False) -> float:
    """Seconds from creating the loader's iterator to its first batch, summed over ``epochs``."""
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=workers,
                        multiprocessing_context=context, persistent_workers=persistent)
    total = 0.0
    for _ in range(epochs):
        start = time.perf_counter()
        batches = iter(loader)
        next(batches)
        total += time.perf_counter() - start
        del batches
    return total


@contextlib.contextmanager
def _stderr_to(path):
    """File descriptor 2 into ``path``: a worker process inherits it, so its traceback lands there."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "w") as sink:
        os.dup2(sink.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def what_breaks(dataset, context: str, workers: int = 1) -> str:
    """'' when a batch arrives, else one line: the worker's own error where it printed one
    (the loader itself only says that a worker exited)."""
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "worker-stderr")
        try:
            with _stderr_to(log):
                next(iter(DataLoader(dataset, batch_size=8, num_workers=workers,
                                     multiprocessing_context=context)))
            return ""
        except Exception as err:  # noqa: BLE001  (the lesson is the message)
            errors = [ln.strip() for ln in open(log).read().splitlines() if "Error" in ln]
            return errors[-1] if errors else f"{type(err).__name__}: {str(err).splitlines()[0]}"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=positive_int, default=2)
    p.add_argument("--epochs", type=positive_int, default=2)
    args = p.parse_args(argv)
    dataset = data.digits("train")
    for context in CONTEXTS:
        fresh = first_batch_seconds(dataset, context, args.workers, epochs=args.epochs)
        kept = first_batch_seconds(dataset, context, args.workers, epochs=args.epochs, persistent=True)
        print(f"{context:6s} {args.workers} workers: first batch of {args.epochs} epochs {fresh:6.2f} s; "
              f"with persistent_workers {kept:6.2f} s")


if __name__ == "__main__":
    run_main(main)
