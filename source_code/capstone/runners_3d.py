"""Three kinds at once: pipeline x data x tensor, and data x tensor x context parallelism.

* "PP x DP x TP" (``pp_dp_tp``): notebook 12's mesh.pipeline3d on the seed checkpoint: a
  (pp, dp, tp) mesh, every stage's blocks tensor-parallel on "tp" (mesh.tp.apply_tp), the
  stages driven by torch's ScheduleGPipe over "pp" (pipeline3d.make_schedule: scale_grads off),
  each stage's gradients summed over "dp" in one flat buffer (pipeline3d.all_reduce_grads);
* "DP x TP x CP" (``dp_tp_cp``): a (dp, cp, tp) mesh, the blocks tensor-parallel on "tp", ring
  attention over "cp" on this rank's heads (cp_model), the count and the gradients over the
  ranks that read other tokens (runner.token_group).

Both take any sizes (a size of 1 drops that kind), so choose.py builds every combination it
accepts from them. The mesh puts tensor parallelism innermost (the ranks of one node on a
cluster) and pipeline or data parallelism outermost (across nodes), as torchtitan orders its
("pp", "dp_replicate", "fsdp", "tp") mesh.
"""
from __future__ import annotations

import torch

from source_code.capstone import seed
from source_code.capstone.cp_model import cp_logits, my_tokens
from source_code.capstone.loss import StepLoss, global_token_count, global_token_loss
from source_code.capstone.runner import (Runner, Spec, full_weights, mesh, piece, report,
                                         sum_and_step, token_group)
from source_code.context_parallel.comm import Ring
from source_code.mesh import pipeline3d
from source_code.mesh.reference import make_optimizer
from source_code.mesh.tp import apply_tp
from source_code.pipeline.stages import TransformerStage

MICROBATCHES = 2          # per pipeline, as pipeline3d's run_3d


def pp_dp_tp(spec: Spec, pp: int = 2, dp: int = 2, tp: int = 2,
             microbatches: int = MICROBATCHES) -> Runner:
    from torch.distributed.pipelining import PipelineStage
    grid = mesh((pp, dp, tp), ("pp", "dp", "tp"))
    stage_index, copy = grid["pp"].get_local_rank(), grid["dp"].get_local_rank()
    data = token_group(grid)                          # "dp": the pipelines reading other samples
    first, last = stage_index == 0, stage_index == pp - 1
    module = TransformerStage(seed.load_seed(spec.path, dtype=spec.dtype), stage_index, pp)
    if tp > 1:
        apply_tp(module, grid["tp"])
    stage = PipelineStage(module, stage_index, pp, torch.device("cpu"), group=grid["pp"].get_group())
    loss_fn = StepLoss()                              # divides by this step's count
    schedule = pipeline3d.make_schedule(stage, microbatches, loss_fn)
    opt = make_optimizer(module.parameters(), spec.lr)

    def step(x, y):
        xs, ys = piece((x, y), copy, dp)                               # this pipeline's samples
        loss_fn.count = global_token_count(ys.chunk(microbatches), data)  # before any backward
        parts: list = []
        args = (xs,) if first else ()
        schedule.step(*args, **({"target": ys, "losses": parts} if last else {}))
        pipeline3d.all_reduce_grads(module, data)
        opt.step()
        opt.zero_grad()
        return report(torch.stack([v.detach() for v in parts]).sum(), data) if last else None

    def weights():
        full = full_weights(module)                                    # DTensors gathered over "tp"
        return dict(zip(module.source_names, full.values(), strict=True))
    return Runner(step, weights)


def dp_tp_cp(spec: Spec, dp: int = 2, tp: int = 2, cp: int = 2) -> Runner:
    grid = mesh((dp, cp, tp), ("dp", "cp", "tp"))
    model = seed.load_seed(spec.path, dtype=spec.dtype)
    if tp > 1:
        apply_tp(model, grid["tp"])
    ring = Ring(grid["cp"].get_group())
    data = token_group(grid)
    opt = make_optimizer(model.parameters(), spec.lr)

    def step(x, y):
        xs, ys = piece((x, y), grid["dp"].get_local_rank(), dp)        # my samples
        ys = my_tokens(ys, ring)                                       # my tokens of them
        loss = global_token_loss(cp_logits(model, xs, ring), ys, global_token_count([ys], data))
        return sum_and_step(loss, model, opt, data)
    return Runner(step, lambda: full_weights(model))


ROWS = {"PP x DP x TP": pp_dp_tp, "DP x TP x CP": dp_tp_cp}
WORLD = 8
