"""Loss normalisation with uneven tokens: the mean of per-piece means is not the per-token mean.

A batch split over ranks (DDP) or over microbatches (gradient accumulation, a pipeline
schedule) gives each piece its own number of valid targets (padding, packing, a masked loss).
The usual code computes each piece's MEAN loss and then averages the pieces: DDP averages
the gradients over ranks, accumulation divides each loss by the number of microbatches, and
torch's pipeline schedules scale the gradients by 1/microbatches. That weights every piece
equally, so a token in a short piece counts more than a token in a long one. The per-token
mean of one process on the whole batch weights every token equally. The fix:

    loss_sum = F.cross_entropy(logits, targets, ignore_index=-100, reduction="sum")
    n_valid = (targets != -100).sum()            # this piece's tokens
    dist.all_reduce(n_valid, group=group)        # everyone's tokens (accumulation: add them up)
    loss = loss_sum / n_valid                    # divide once, by the global count

and, where a wrapper averages gradients over the ranks (DDP, FSDP), multiply the loss by the
number of ranks to undo that average (or reduce with a SUM).

``uneven_case`` runs on ranks 0 and 1 of a process group (the others return at once): the
gradients of DDP, of accumulation and of a 2-stage GPipe pipeline, naive and fixed, against
the one-process gradient of the whole batch.
"""
from __future__ import annotations

import functools

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from source_code.capstone import seed
from source_code.distributed import context
from source_code.pipeline import simulator
from source_code.pipeline.comms import StageLink
from source_code.pipeline.schedules import run_step
from source_code.pipeline.stages import TransformerStage

COUNTS = (16, 12, 3, 1)   # valid targets of the 4 samples: rank 0 holds 28, rank 1 holds 4


def global_token_loss(logits, targets, group=None):
    """Summed cross-entropy of this piece / valid targets of ALL pieces (a collective)."""
    loss_sum = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100,
                               reduction="sum")
    n_valid = (targets != -100).sum()
    dist.all_reduce(n_valid, group=group)
    return loss_sum / n_valid


def mean_loss(logits, targets):
    """The per-piece mean every framework computes by default."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)


def uneven_batch(counts=COUNTS):
    """4 samples of the sort task, sample i keeping its first counts[i] valid targets."""
    x, y = seed.batches(1, len(counts))[0]
    y = y.clone()
    for row, keep in zip(y, counts):
        valid = (row != -100).nonzero().flatten()
        row[valid[keep:]] = -100
    return x, y


def max_grad_diff(named_grads: dict, reference: dict) -> float:
    return max((g - reference[n]).abs().max().item() for n, g in named_grads.items())


def one_process(path, x, y):
    """name -> gradient of the per-token mean loss of the whole batch, and that loss."""
    model = seed.load_seed(path)
    loss = mean_loss(model(x), y)
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}, loss.item()


def ddp_grads(path, x, y, fixed: bool, group) -> tuple[dict, float]:
    """DDP on the 2 ranks of ``group``, each on half the batch; the loss every rank reports."""
    me, world = dist.get_rank(group), dist.get_world_size(group)
    model = DDP(seed.load_seed(path), process_group=group)
    xs, ys = x.chunk(world)[me], y.chunk(world)[me]
    if fixed:   # DDP averages the gradients over the ranks: x world undoes it
        loss = global_token_loss(model(xs), ys, group) * world
    else:
        loss = mean_loss(model(xs), ys)
    loss.backward()
    shown = loss.detach() / (world if fixed else 1)
    dist.all_reduce(shown, group=group)
    reported = shown.item() / (1 if fixed else world)
    return {n: p.grad.clone() for n, p in model.module.named_parameters()}, reported


def accumulation_grads(path, x, y, fixed: bool, micro: int = 2) -> dict:
    """One process, ``micro`` microbatches, gradients accumulated."""
    model = seed.load_seed(path)
    total = int((y != -100).sum())
    for xs, ys in zip(x.chunk(micro), y.chunk(micro)):
        logits = model(xs)
        if fixed:
            loss = F.cross_entropy(logits.flatten(0, 1), ys.flatten(), ignore_index=-100,
                                   reduction="sum") / total
        else:
            loss = mean_loss(logits, ys) / micro
        loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def _pipeline_loss(out, target, total, micro, fixed):
    if fixed:
        return F.cross_entropy(out.flatten(0, 1), target.flatten(), ignore_index=-100,
                               reduction="sum") / total
    return mean_loss(out, target) / micro      # torch's schedules: scale_grads divides by m


def pipeline_grads(path, x, y, fixed: bool, group, micro: int = 2) -> dict:
    """GPipe (pipeline/schedules.py) over the 2 ranks of ``group``: this stage's gradients."""
    s, p = dist.get_rank(group), dist.get_world_size(group)
    stage = TransformerStage(seed.load_seed(path), s, p)
    link = StageLink(s, p, context().device, ranks=dist.get_process_group_ranks(group), group=group)
    loss_fn = functools.partial(_pipeline_loss, total=int((y != -100).sum()), micro=micro, fixed=fixed)
    b, t = x.shape
    run_step(stage, simulator.stage_order("gpipe", p, micro, s), link,
             (b // micro, t, stage_dim(path)), inputs=list(x.chunk(micro)) if s == 0 else None,
             targets=list(y.chunk(micro)) if s == p - 1 else None, loss_fn=loss_fn)
    return {n: q.grad.clone() for n, q in zip(stage.source_names, stage.parameters())}


def stage_dim(path) -> int:
    return torch.load(path, map_location="cpu", weights_only=True)["cfg"]["dim"]


def uneven_case(path) -> dict | None:
    """On every rank of the job; ranks 0 and 1 compute, the others wait. Rank 0 returns
    {"counts", "losses": {"per-token", "mean of rank means"}, "ddp"|"accumulation"|"pipeline":
    {"naive", "fixed"} max |gradient - one process|}, rank 1 the same, the others None."""
    group = dist.new_group([0, 1])          # every rank must take part in making the group
    if dist.get_rank() > 1:
        return None
    x, y = uneven_batch()
    ref, ref_loss = one_process(path, x, y)
    out = {"counts": list(COUNTS), "losses": {"per-token": ref_loss}}
    for fixed in (False, True):
        key = "fixed" if fixed else "naive"
        grads, reported = ddp_grads(path, x, y, fixed, group)
        out.setdefault("ddp", {})[key] = max_grad_diff(grads, ref)
        out["losses"]["ddp " + key] = reported
        out.setdefault("accumulation", {})[key] = max_grad_diff(accumulation_grads(path, x, y, fixed), ref)
        diff = torch.tensor([max_grad_diff(pipeline_grads(path, x, y, fixed, group), ref)])
        dist.all_reduce(diff, op=dist.ReduceOp.MAX, group=group)   # both stages' parameters
        out.setdefault("pipeline", {})[key] = diff.item()
    return out
