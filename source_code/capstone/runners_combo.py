"""Combinations on a 2 x 2 mesh of the 4 ranks (the last dimension varies fastest).

* "FSDP x TP": mesh.tp.build_2d (notebook 12): DTensor TP on "tp", FSDP2 on "dp";
* "DP x CP": each dp group its half of the samples, each cp rank its tokens (ring attention):
  runners_3d.dp_tp_cp with tp = 1;
* "EP x DP": the MoE model, experts split over "ep", copies of them over "dp" (notebook 14);
* "PP x DP": two 2-stage 1F1B pipelines (own schedule), each on half the samples, each
  stage's gradients summed with its copy in the other pipeline.

The count of valid targets is summed over the ranks that hold other tokens: "dp" (and "cp";
"dp" x "ep" in EP x DP, whose expert-parallel ranks hold other samples); the tensor-parallel
and pipeline ranks of one data-parallel copy read the same tokens.
"""
from __future__ import annotations

from source_code.capstone import seed
from source_code.capstone.loss import global_token_count, global_token_loss
from source_code.capstone.runner import Runner, Spec, full_weights, mesh, piece, report
from source_code.capstone.runners_3d import dp_tp_cp
from source_code.capstone.runners_model import expert_parallel
from source_code.capstone.runners_pipeline import own
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


def pp_dp(spec: Spec, dp: int = 2, pp: int = 2, schedule: str = "1f1b") -> Runner:
    grid = mesh((dp, pp), ("dp", "pp"))
    return own(spec, schedule, ranks=grid["pp"].mesh.tolist(), group=grid["pp"].get_group(),
               dp_group=grid["dp"].get_group(), dp_index=grid["dp"].get_local_rank(), dp=dp)


ROWS = {"FSDP x TP": fsdp_tp,
        "DP x CP": lambda s: dp_tp_cp(s, dp=2, tp=1, cp=2),
        "EP x DP": lambda s: expert_parallel(s, dp=2),
        "PP x DP": pp_dp}
