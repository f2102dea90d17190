"""Gradient accumulation: the big batch's update from m small backward passes, and DDP's no_sync.

    python -m source_code.memory.report      # (the single-process check; no_sync needs 2 processes)

Activations grow with the batch; the update should not depend on how the batch is cut. Split
a batch of B sequences into m micro-batches, weigh each micro-batch's summed loss by the
number of targets of the WHOLE batch (workload.lm_loss), call backward on each (the
gradients add up in ``.grad``), step once: the update equals the big batch's, with 1/m of
its activations alive at a time.

    for x, y in zip(xs.chunk(m), ys.chunk(m)):       # accumulate(): under DDP, no_sync too
        lm_loss(model(x), y, n_valid).backward()     # activations of B/m sequences at a time
    opt.step(); opt.zero_grad()

Under DDP every backward all-reduces the gradients; inside ``with model.no_sync():`` it only
accumulates locally, so a step of m micro-batches all-reduces once (on the last), not m times.
ZeRO-1 and ZeRO-2 under accumulation (what they hold, when they reduce-scatter) are in
source_code/planner/accumulation.py (notebook 12).
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from source_code import workload
from source_code.measure import CommCounter, clock
from source_code.workload import lm_loss

BATCH = 8
LR = 0.5


def global_batch(step: int = 0, batch: int = BATCH, seq_task: int = 64):
    """(inputs, targets) of the workload's global batch number ``step``."""
    if batch < 1:
        raise ValueError(f"batch={batch}: at least one sequence")
    return workload.global_batch(workload.sort_task(n=seq_task), step, batch)


def accumulate(model, pieces, n_valid: int, scale: float = 1.0, use_no_sync: bool = False) -> None:
    """Backward on each micro-batch of ``pieces``; the gradients add up in ``.grad``. Under DDP
    with ``use_no_sync`` only the last backward all-reduces."""
    for i, (xm, ym) in enumerate(pieces):
        last = i == len(pieces) - 1
        quiet = model.no_sync() if use_no_sync and not last else contextlib.nullcontext()
        with quiet:                                   # no all-reduce until the last piece
            (lm_loss(model(xm), ym, n_valid) * scale).backward()


def _check_pieces(batch: int, micro_batches: int) -> None:
    if micro_batches < 1 or batch % micro_batches:
        raise ValueError(f"{micro_batches} micro-batches do not cut a batch of {batch} sequences "
                         f"evenly; choose a divisor of {batch}")


def train(micro_batches: int, steps: int = 2, batch: int = BATCH, cfg: dict | None = None,
          device="cpu") -> tuple[list[torch.Tensor], float]:
    """One process, plain SGD, each batch in ``micro_batches`` pieces: (weights, seconds per step).

    SGD, so that the float rounding of summing in other orders shows as it is (AdamW divides
    by the root of tiny second moments and would magnify it)."""
    _check_pieces(batch, micro_batches)
    model = workload.build_model(cfg or workload.model_config(), 0, device)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    seconds = 0.0
    for s in range(steps):
        x, y = (t.to(device) for t in global_batch(s, batch))
        n_valid = int((y != -100).sum())
        t0 = clock(device)
        accumulate(model, list(zip(x.chunk(micro_batches), y.chunk(micro_batches))), n_valid)
        opt.step()
        opt.zero_grad()
        seconds += clock(device) - t0
    return [p.detach().clone() for p in model.parameters()], seconds / steps


def same_update(micro_batches: int = 4, steps: int = 2) -> dict:
    """Max |weight difference| between the whole batch and ``micro_batches`` pieces, and the
    time of a step of each (one process)."""
    _check_pieces(BATCH, micro_batches)
    train(micro_batches, 1)                                   # warm up
    big, t_big = train(1, steps)
    acc, t_acc = train(micro_batches, steps)
    return {"micro_batches": micro_batches,
            "max_abs_diff": max((a - b).abs().max().item() for a, b in zip(big, acc)),
            "seconds_big": t_big, "seconds_accumulated": t_acc}


def ddp_run(ctx, world: int, micro_batches: int, steps: int, use_no_sync: bool):
    """On each rank: DDP training with accumulation; (the module, all-reduce calls per step)."""
    model = DDP(workload.build_model(workload.model_config(), 0, ctx.device), device_ids=ctx.device_ids)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    counter = CommCounter(world)
    with counter:
        for s in range(steps):
            x, y = global_batch(s)
            n_valid = int((y != -100).sum())
            xs, ys = (t.to(ctx.device) for t in workload.rank_slice((x, y), dist.get_rank(), world))
            # DDP averages the gradients over the ranks: scale each rank's share back up
            accumulate(model, list(zip(xs.chunk(micro_batches), ys.chunk(micro_batches))), n_valid,
                       scale=world, use_no_sync=use_no_sync)
            opt.step()
            opt.zero_grad()
    return model.module, counter.calls["all_reduce"] / steps


def ddp_no_sync(micro_batches: int = 4, steps: int = 2) -> dict:
    """On each rank of processes.spawn: DDP with accumulation, with and without no_sync.

    Each rank takes its share of every global batch (workload.rank_slice) in ``micro_batches``
    pieces; the loss of a piece is its summed cross-entropy over the global count of targets
    times the number of ranks (DDP averages over ranks). Returns, for each, the all-reduce
    calls per step and the max |weight difference| from one process on the whole batches."""
    from source_code.distributed import context
    ctx, world = context(), dist.get_world_size()
    _check_pieces(BATCH // world, micro_batches)
    want, _ = train(1, steps, device=ctx.device)
    out = {"micro_batches": micro_batches}
    for name, use in (("no_sync", True), ("every_backward", False)):
        model, calls = ddp_run(ctx, world, micro_batches, steps, use)
        out[name] = {"all_reduce_calls_per_step": calls, "max_abs_diff": max(
            (p.detach() - w).abs().max().item() for p, w in zip(model.parameters(), want))}
        if ctx.rank == 0:                             # progress, streamed into the notebook
            print(f"rank 0: DDP {name}: {calls:.0f} all-reduce(s) per step", flush=True)
    return out
