"""Notebook 09's multi-process runs, grouped by their number of processes: each group starts once.

    from source_code import processes
    from source_code.sharding import notebook_runs
    two = processes.spawn(notebook_runs.two_ranks, 2, memory_cfg)[0]      # rank 0's dict
    four = processes.spawn(notebook_runs.four_ranks, 4, memory_cfg, {})[0]

On 2 CPU cores, starting N processes (each imports torch, joins the group, pays its first
collectives and FSDP2's first-use costs) takes longer than most of the notebook's small runs.
So the 2-process runs (parity.py, overlap.py, memory_report's rows at N = 2) share one group
of processes, and the 4-process runs (fsdp_demo.py, own_fsdp_report.py, memory_report's rows
at N = 4) another. Each part is the entry point's own function on the entry point's default
sizes; what an entry point prints comes back as text (rank 0), as it would print it, and the
notebook cell of each section reads its part. Every entry point still runs alone, with the
command in its docstring.

Section 6's training and loading runs are train.py's and dcp_demo.py's own code the same way
(``train_run``, ``dcp_load``: the flags parsed and checked as their main() does), in processes
forked from the server that has torch loaded rather than started by torchrun.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import tempfile
import warnings

import torch.distributed as dist

from source_code import workload
from source_code.distributed import context, print0, seed_everything
from source_code.sharding import (checkpointing, dcp_demo, fsdp_demo, memory_report, overlap, own_fsdp_report,
                                  parity, train)

# the entry points' defaults (their argparse defaults)
PARITY = dict(steps=5, batch_size=16, lr=3e-3, dim=64, layers=2, seed=0, tol=1e-6,
              impls=list(parity.IMPLS))
FSDP_DEMO = dict(dim=64, layers=2, big_dim=256, big_layers=8, trained_logit=10.0)
OVERLAP = dict(dim=128, layers=4, steps=3)


class _Tee(io.StringIO):
    """Keeps what is written and passes it on (to the notebook, as it comes)."""

    def __init__(self, through):
        super().__init__()
        self.through = through

    def write(self, text: str) -> int:
        if self.through is not None:
            self.through.write(text)
        return super().write(text)


def printed(fn, *args, show: bool = True):
    """(fn(*args), the text it printed); with ``show`` the text is printed as it comes too."""
    tee = _Tee(sys.stdout if show else None)
    with contextlib.redirect_stdout(tee):
        value = fn(*args)
    return value, tee.getvalue()


@contextlib.contextmanager
def quiet_descriptors():
    """The profiler library writes a line at every start and stop straight to file descriptors
    1 and 2 (not through sys.stdout): send those to /dev/null meanwhile."""
    sys.stdout.flush()
    saved = [os.dup(1), os.dup(2)]
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, null):
            os.close(fd)


def two_ranks(memory_cfg: dict, batch_size: int = 16) -> dict | None:
    """On each of 2 ranks: parity.py's run, memory_report's rows, overlap.py's three variants."""
    ctx = context()
    _, parity_text = printed(parity.run, ctx, argparse.Namespace(**PARITY))
    rows = memory_report.measure_rank(memory_cfg, batch_size)
    print0(f"memory_report: {len(rows or [])} rows at N={ctx.world_size} (section 4)")
    cfg = workload.model_config(dim=OVERLAP["dim"], n_layers=OVERLAP["layers"])
    with tempfile.TemporaryDirectory(prefix="fsdp-trace-") as trace_dir, warnings.catch_warnings(), \
            quiet_descriptors():
        warnings.filterwarnings("ignore", message=".*Profiler clears events")
        variants = overlap.run_variants(ctx, cfg, OVERLAP["steps"], trace_dir)
    print0(f"overlap: {len(variants)} variants profiled (section 3)")
    dist.barrier()
    if not ctx.is_main:
        return None
    return {"parity": parity_text, "memory_rows": rows,
            "overlap": {"world_size": ctx.world_size, "device": ctx.device.type, "variants": variants}}


def four_ranks(memory_cfg: dict, own_flags: dict, batch_size: int = 16) -> dict | None:
    """On each of 4 ranks: fsdp_demo.py's run, memory_report's rows, own_fsdp_report's run."""
    ctx = context()
    _, demo_text = printed(fsdp_demo.run, ctx, argparse.Namespace(**FSDP_DEMO), show=False)
    print0("fsdp_demo: done (section 3 reads its lines)")
    rows = memory_report.measure_rank(memory_cfg, batch_size)
    print0(f"memory_report: {len(rows or [])} rows at N={ctx.world_size} (section 4)")
    own = own_fsdp_report.run_here(own_flags)
    if not ctx.is_main:
        return None
    return {"own_fsdp": own, "fsdp_demo": demo_text, "memory_rows": rows}


def train_run(argv: list) -> str:
    """On every rank: train.py's main() inside this group (its flags parsed and checked, seeded
    as its session does, then ``train.train``); returns what rank 0 printed."""
    args = train.parse_args([str(a) for a in argv])
    train_set, test_set, cfg = train.check(args)
    seed_everything(args.seed, context().rank)
    return printed(train.train, context(), args, train_set, test_set, cfg)[1]


def dcp_load(checkpoint, full="") -> str:
    """On every rank: dcp_demo.py's main() inside this group: the newest checkpoint under
    ``checkpoint`` loaded on this group's ranks, compared with ``full``; rank 0's line."""
    args = argparse.Namespace(checkpoint=str(checkpoint), full=str(full))
    return printed(dcp_demo.run, context(), args, checkpointing.read_progress(checkpoint))[1]
