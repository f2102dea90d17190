"""Loss normalisation with uneven tokens: the mean of per-piece means is not the per-token mean.

A batch split over ranks (DDP, context parallelism) or over microbatches (gradient
accumulation, a pipeline schedule) gives each piece its own number of valid targets (padding,
packing, a masked prompt). The usual code computes each piece's MEAN loss and then averages the
pieces: DDP averages the gradients over ranks, accumulation divides each microbatch's loss by
the number of microbatches, torch's pipeline schedules divide the gradients by it
(``scale_grads=True``, their default, "for loss functions which perform 'mean' loss
reduction"), and a data x context-parallel mesh averages over its ranks. That weights every
piece equally, so a token in a short piece counts more than a token in a long one. The fix
(loss.py): the count of every piece of the step, summed over the ranks and microbatches (here
before the first backward), and each piece's summed loss divided by it; gradients summed, not
averaged (or the loss multiplied by the number of ranks a wrapper averages over).

``uneven_cases`` runs on ranks 0 and 1 of a process group (the others return at once) and
compares each case's gradients, naive and fixed, with the one-process gradient of the whole
batch:

    ddp              DDP on 2 ranks, 2 samples each (16 + 12 valid targets against 3 + 1)
    accumulation     one process, 2 microbatches of 2 samples
    dp_accumulation  DDP on 2 ranks x 2 microbatches of 1 sample (torchtitan's case)
    cp               ring attention on 2 ranks; 4 EQUAL samples of 12 valid targets each: the
                     sort task predicts positions 16-31, of which each sample keeps 16-27 (a
                     padded tail, 28-31, masked); the zigzag chunks give rank 0 4 of them per
                     sample (24-27) and rank 1 8 (16-23). Without the padded tail both would
                     hold 8: the prompt mask alone falls evenly on the zigzag chunks.
    torch_pipeline   torch's ScheduleGPipe, 2 stages x 2 microbatches (scale_grads on / off)
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from source_code import torch_versions, workload
from source_code.capstone import seed
from source_code.capstone.cp_model import LAYOUT, cp_logits, my_tokens
from source_code.capstone.loss import (global_token_count, global_token_loss, local_token_count,
                                       mean_loss)
from source_code.context_parallel import layout
from source_code.context_parallel.comm import Ring
from source_code.mesh.reference import make_optimizer
from source_code.pipeline.stages import TransformerStage

COUNTS = (16, 12, 3, 1)       # valid targets of the 4 samples: rank 0 holds 28, rank 1 holds 4
EQUAL = (12, 12, 12, 12)      # the context-parallel case: equal samples, unequal chunks
FULL = (16, 16, 16, 16)       # every predicted position kept: the prompt mask alone
MICRO = 2


def uneven_batch(counts=COUNTS):
    """4 samples of the sort task (each predicts its last 16 tokens), sample i keeping its first
    counts[i] valid targets (from the unmasked batch: seed.batches has masked some already)."""
    x, y = workload.global_batch(workload.sort_task(n=256), 0, len(counts))
    y = y.clone()
    for row, keep in zip(y, counts):
        valid = (row != -100).nonzero().flatten()
        row[valid[keep:]] = -100
    return x, y


def zigzag_counts(y, cp: int = 2) -> list[int]:
    """Valid targets of the batch ``y`` on each of ``cp`` context-parallel ranks (zigzag chunks)."""
    return [int((layout.shard(y, r, cp, LAYOUT, dim=1) != -100).sum()) for r in range(cp)]


def cp_layout(cp: int = 2) -> dict:
    """What the context-parallel case's batch holds: {"per_sample": valid targets of each EQUAL
    sample, "kept": the positions sample 0 keeps, "predicted": (first, last) position the sort
    task predicts, "chunks": valid targets of each zigzag rank, "chunks_prompt": the same with
    every predicted position kept (the prompt masked, no padded tail)}."""
    _, y = uneven_batch(EQUAL)
    _, y_full = uneven_batch(FULL)
    predicted = (y_full[0] != -100).nonzero().flatten().tolist()
    return {"per_sample": (y != -100).sum(1).tolist(),
            "kept": (y[0] != -100).nonzero().flatten().tolist(),
            "predicted": (predicted[0], predicted[-1]),
            "chunks": zigzag_counts(y, cp), "chunks_prompt": zigzag_counts(y_full, cp)}


def grads(named) -> dict:
    return {n: p.grad.clone() for n, p in named}


def max_grad_diff(named_grads: dict, reference: dict) -> float:
    return max((g - reference[n]).abs().max().item() for n, g in named_grads.items())


def one_process(path, x, y):
    """name -> gradient of the per-token mean loss of the whole batch, and that loss."""
    model = seed.load_seed(path)
    loss = mean_loss(model(x), y)
    loss.backward()
    return grads(model.named_parameters()), loss.item()


def ddp_case(path, x, y, fixed: bool, group, micro: int = 1) -> tuple[dict, float]:
    """DDP on the 2 ranks of ``group``, each on half the batch in ``micro`` microbatches;
    the loss it reports (the same on both ranks)."""
    me, world = dist.get_rank(group), dist.get_world_size(group)
    model = DDP(seed.load_seed(path), process_group=group)
    pieces = list(zip(x.chunk(world)[me].chunk(micro), y.chunk(world)[me].chunk(micro)))
    count = global_token_count([ys for _, ys in pieces], group) if fixed else None   # first
    shown = torch.zeros(1)
    for i, (xs, ys) in enumerate(pieces):
        with model.no_sync() if i < micro - 1 else contextlib.nullcontext():
            if fixed:   # DDP averages the gradients over the ranks: x world undoes it
                loss = global_token_loss(model(xs), ys, count)
                (loss * world).backward()
            else:
                loss = mean_loss(model(xs), ys) / micro
                loss.backward()
        shown += loss.detach()
    dist.all_reduce(shown, group=group)
    return grads(model.module.named_parameters()), shown.item() / (1 if fixed else world)


def accumulation_case(path, x, y, fixed: bool, micro: int = MICRO) -> dict:
    """One process, ``micro`` microbatches, gradients accumulated."""
    model = seed.load_seed(path)
    pieces = list(zip(x.chunk(micro), y.chunk(micro)))
    count = local_token_count([ys for _, ys in pieces])               # all fetched first
    for xs, ys in pieces:
        logits = model(xs)
        loss = global_token_loss(logits, ys, count) if fixed else mean_loss(logits, ys) / micro
        loss.backward()
    return grads(model.named_parameters())


def cp_case(path, x, y, fixed: bool, group) -> dict:
    """Ring attention over the 2 ranks of ``group``: each its zigzag tokens of every sample.
    Naive: each rank's mean over its tokens, gradients averaged over the ranks."""
    ring, world = Ring(group), dist.get_world_size(group)
    model = seed.load_seed(path)
    logits, ys = cp_logits(model, x, ring), my_tokens(y, ring)
    loss = global_token_loss(logits, ys, global_token_count([ys], group)) if fixed else mean_loss(logits, ys)
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad, group=group)
        if not fixed:
            p.grad /= world                   # as DDP or FSDP over a dp x cp mesh average
    return grads(model.named_parameters())


def torch_pipeline_case(path, x, y, fixed: bool, group, micro: int = MICRO) -> dict:
    """torch's ScheduleGPipe over the 2 ranks of ``group``, one stage each: this stage's
    gradients. Naive: the mean loss per microbatch and torch's default scale_grads=True."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
    s, p = dist.get_rank(group), dist.get_world_size(group)
    module = TransformerStage(seed.load_seed(path), s, p)
    stage = PipelineStage(module, s, p, torch.device("cpu"), group=group)
    count = local_token_count(y.chunk(micro))                         # before the schedule runs
    if fixed:
        schedule = ScheduleGPipe(stage, micro, loss_fn=lambda out, t: global_token_loss(out, t, count),
                                 scale_grads=False)
    else:
        schedule = ScheduleGPipe(stage, micro, loss_fn=mean_loss)    # scale_grads=True: / micro
    schedule.step(x) if s == 0 else schedule.step(target=y, losses=[])
    return {n: q.grad.clone() for n, q in zip(module.source_names, module.parameters(), strict=True)}


def ddp_curve(path, data, lr: float, dtype, fixed: bool) -> list[float]:
    """DDP on every rank of the world, trained on ``data`` (SGD with momentum): per step, the
    per-token loss of the whole global batch before the step. Naive: each rank's mean loss,
    DDP's average of the gradients; fixed: the global-count loss, x world."""
    world, rank = dist.get_world_size(), dist.get_rank()
    model = DDP(seed.load_seed(path, dtype=dtype))
    opt = make_optimizer(model.parameters(), lr)
    curve = []
    for x, y in data:
        xs, ys = x.chunk(world)[rank], y.chunk(world)[rank]
        logits = model(xs)
        share = global_token_loss(logits, ys, global_token_count([ys]))   # my part of the loss
        (share * world if fixed else mean_loss(logits, ys)).backward()
        opt.step()
        opt.zero_grad()
        total = share.detach().clone()
        dist.all_reduce(total)                                             # the ranks' parts
        curve.append(total.item())
    return curve


def cases() -> tuple:
    """The cases this torch runs (torch's GPipe on gloo: torch_versions, "gpipe")."""
    return ("ddp", "accumulation", "dp_accumulation", "cp") + (
        ("torch_pipeline",) if torch_versions.supported("gpipe", "cpu") else ())


def uneven_cases(path) -> dict | None:
    """On every rank of the job; ranks 0 and 1 compute, the others wait. Ranks 0 and 1 return
    {"counts", "equal", "losses": {"per-token", "ddp naive", "ddp fixed"}, case: {"naive",
    "fixed"} max |gradient - one process| over both ranks' parameters}; the others None."""
    group = dist.new_group([0, 1])          # every rank must take part in making the group
    if dist.get_rank() > 1:
        return None
    x, y = uneven_batch()
    xe, ye = uneven_batch(EQUAL)
    ref, ref_loss = one_process(path, x, y)
    ref_equal, _ = one_process(path, xe, ye)
    out = {"counts": list(COUNTS), "equal": list(EQUAL), "losses": {"per-token": ref_loss}}
    for fixed in (False, True):
        key = "fixed" if fixed else "naive"
        got, reported = ddp_case(path, x, y, fixed, group)
        out["losses"]["ddp " + key] = reported
        diffs = {"ddp": max_grad_diff(got, ref),
                 "accumulation": max_grad_diff(accumulation_case(path, x, y, fixed), ref),
                 "dp_accumulation": max_grad_diff(ddp_case(path, x, y, fixed, group, MICRO)[0], ref),
                 "cp": max_grad_diff(cp_case(path, xe, ye, fixed, group), ref_equal)}
        if "torch_pipeline" in cases():
            diffs["torch_pipeline"] = max_grad_diff(torch_pipeline_case(path, x, y, fixed, group), ref)
        for case, diff in diffs.items():
            t = torch.tensor([diff], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)    # both ranks' parameters
            out.setdefault(case, {})[key] = t.item()
    return out
