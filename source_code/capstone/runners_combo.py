"""Combinations on a 2 x 2 mesh of the 4 ranks (the last dimension varies fastest).

* "FSDP x TP": mesh.tp.build_2d (notebook 12): DTensor TP on "tp", FSDP2 on "dp";
* "DP x CP": notebook 13's training step (context_parallel.model_step) on the (dp, cp) mesh:
  each dp group its half of the samples, each cp rank its tokens of them, ring attention;
* "EP x DP": the MoE model, experts split over "ep", copies of them over "dp" (notebook 14);
* "PP x DP": two 2-stage 1F1B pipelines (own schedule), each on half the samples, each
  stage's gradients summed with its copy in the other pipeline.

Each computes its loss on its own piece divided by the valid targets of the whole step
(loss.py, section 1 of notebook 19; DP x CP with notebook 13's own model_step.global_token_loss).
"""
from __future__ import annotations

from source_code.capstone import seed
from source_code.capstone.loss import global_token_count, global_token_loss
from source_code.capstone.runner import Runner, Spec, flat_group, full_weights, mesh, piece, report
from source_code.capstone.runners_model import expert_parallel
from source_code.capstone.runners_pipeline import own
from source_code.context_parallel import model_step
from source_code.mesh.reference import make_optimizer
from source_code.mesh.tp import build_2d


def fsdp_tp(spec: Spec, dp: int = 2, tp: int = 2) -> Runner:
    grid = mesh((dp, tp), ("dp", "tp"))
    model = build_2d(seed.load_seed(spec.path, dtype=spec.dtype), grid)
    opt = make_optimizer(model.parameters(), spec.lr)
    me, dp_group = grid["dp"].get_local_rank(), grid["dp"].get_group()

    def step(x, y):
        xs, ys = piece((x, y), me, dp)
        loss = global_token_loss(model(xs), ys, global_token_count([ys], dp_group))
        (loss * dp).backward()               # FSDP2 averages over "dp": undone
        opt.step()
        opt.zero_grad()
        return report(loss, dp_group)
    return Runner(step, lambda: full_weights(model))


def dp_cp(spec: Spec, dp: int = 2, cp: int = 2) -> Runner:
    grid = mesh((dp, cp), ("dp", "cp"))
    dp_x_cp = flat_group(grid, ("dp", "cp"))   # 13's mesh_groups passes None (its grid is the job)
    groups = model_step.Groups(grid["dp"].get_local_rank(), dp, grid["cp"].get_local_rank(), cp,
                               grid["cp"].get_group(), grid["dp"].get_group(), dp_x_cp)
    model = seed.load_seed(spec.path, dtype=spec.dtype)
    opt = make_optimizer(model.parameters(), spec.lr)

    def step(x, y):
        loss = model_step.train_step(model, *piece((x, y), groups.dp_rank, dp), groups)
        opt.step()
        opt.zero_grad()
        return loss.item()                   # the batch's loss: the ranks' shares added up
    return Runner(step, lambda: full_weights(model))


def pp_dp(spec: Spec, dp: int = 2, pp: int = 2, schedule: str = "1f1b") -> Runner:
    grid = mesh((dp, pp), ("dp", "pp"))
    return own(spec, schedule, ranks=grid["pp"].mesh.tolist(), group=grid["pp"].get_group(),
               dp_group=grid["dp"].get_group(), dp_index=grid["dp"].get_local_rank(), dp=dp)


ROWS = {"FSDP x TP": fsdp_tp,
        "DP x CP": dp_cp,
        "EP x DP": lambda s: expert_parallel(s, dp=2),
        "PP x DP": pp_dp}
