"""Pipeline configurations: one stage of the TransformerLM per rank, 4 microbatches a step.

* "PP GPipe (own)", "PP 1F1B (own)": the schedules written by hand in notebook 10
  (pipeline.schedules.run_step over pipeline.comms.StageLink);
* "PP GPipe (torch)", "PP 1F1B (torch)": torch.distributed.pipelining's PipelineStage and
  ScheduleGPipe / Schedule1F1B (pipeline/library.py), built with ``scale_grads=False``: the
  schedule's own normalisation divides every gradient by the number of microbatches, which is
  right only for a loss that is a per-microbatch MEAN and microbatches of equal token counts
  (normalisation.py shows it wrong otherwise); our loss already carries 1 / global count;
* "PP x DP" (runners_combo): two 1F1B pipelines, each on half the samples.

The last stage computes the loss of each microbatch; its count covers every microbatch of the
step and every data-parallel copy of the pipeline, known before the schedule starts.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from source_code.capstone import seed
from source_code.capstone.loss import StepLoss, global_token_count, global_token_loss, local_token_count
from source_code.capstone.runner import Runner, Spec, piece, report, sum_gradients
from source_code.distributed import context
from source_code.mesh.reference import make_optimizer
from source_code.pipeline import library, simulator
from source_code.pipeline.comms import StageLink
from source_code.pipeline.schedules import run_step
from source_code.pipeline.stages import TransformerStage

MICROBATCHES = 4
TORCH_SCHEDULES = {"PP GPipe (torch)": "lib-gpipe", "PP 1F1B (torch)": "lib-1f1b"}


def stage_weights(stage) -> dict:
    return dict(zip(stage.source_names, (q.detach().clone() for q in stage.parameters()), strict=True))


def own(spec: Spec, schedule: str, ranks=None, group=None, dp_group=None, dp_index: int = 0,
        dp: int = 1) -> Runner:
    """One stage per rank of ``ranks`` (default: all); with ``dp_group`` the stage's gradients
    are summed over the data-parallel copies of the stage, each on its 1/dp of the batch."""
    ranks = ranks or list(range(dist.get_world_size()))
    s, p = ranks.index(dist.get_rank()), len(ranks)
    full = seed.load_seed(spec.path, dtype=spec.dtype)
    stage = TransformerStage(full, s, p)
    link = StageLink(s, p, context().device, ranks=ranks, group=group)
    opt = make_optimizer(stage.parameters(), spec.lr)
    order = simulator.stage_order(schedule, p, MICROBATCHES, s)
    dim = full.tok.embedding_dim

    def step(x, y):
        xs, ys = piece((x, y), dp_index, dp)                           # this pipeline's samples
        micro = list(ys.chunk(MICROBATCHES))                            # all fetched first
        count = (global_token_count(micro, dp_group) if dp_group is not None
                 else local_token_count(micro))
        rep = run_step(stage, order, link, (xs.shape[0] // MICROBATCHES, xs.shape[1], dim),
                       inputs=list(xs.chunk(MICROBATCHES)) if s == 0 else None,
                       targets=micro if s == p - 1 else None, dtype=spec.dtype,
                       loss_fn=lambda out, tgt: global_token_loss(out, tgt, count))
        if dp_group is not None:
            sum_gradients(stage.parameters(), dp_group)
        opt.step()
        opt.zero_grad()
        if s != p - 1:
            return None
        mine = torch.tensor([sum(rep["losses"])], dtype=torch.float64)
        return report(mine, dp_group) if dp_group is not None else mine.item()
    return Runner(step, lambda: stage_weights(stage))


def torch_schedule(spec: Spec, name: str) -> Runner:
    """torch's schedule ``name`` (library.LIBRARY) over all ranks, one stage each."""
    rank, p = dist.get_rank(), dist.get_world_size()
    stage = TransformerStage(seed.load_seed(spec.path, dtype=spec.dtype), rank, p)
    loss_fn = StepLoss()                              # divides by this step's count
    schedule = library.build(name, {rank: stage}, rank, p, MICROBATCHES, context().device,
                             loss_fn=loss_fn)
    opt = make_optimizer(stage.parameters(), spec.lr)

    def step(x, y):
        loss_fn.count = local_token_count(y.chunk(MICROBATCHES))      # before the schedule runs
        loss = library.step(schedule, name, rank, p, x, y)           # it cuts the microbatches
        opt.step()
        opt.zero_grad()
        return loss
    return Runner(step, lambda: stage_weights(stage))


ROWS = {"PP GPipe (own)": lambda s: own(s, "gpipe"),
        "PP 1F1B (own)": lambda s: own(s, "1f1b"),
        **{row: (lambda s, n=name: torch_schedule(s, n)) for row, name in TORCH_SCHEDULES.items()}}
