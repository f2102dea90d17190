"""Combinations on a 2 x 2 mesh of the 4 ranks (the last dimension varies fastest).

* "FSDP x TP": mesh.tp.build_2d (notebook 12): DTensor TP on "tp", FSDP2 on "dp";
* "DP x CP": each dp group its half of the samples, each cp rank its tokens (ring attention);
* "EP x DP": the MoE model, experts split over "ep", copies of them over "dp" (notebook 14);
* "PP x DP": two 2-stage 1F1B pipelines (own schedule), each on half the samples, each
  stage's gradients summed with its copy in the other pipeline.
"""
from __future__ import annotations

from torch.distributed.device_mesh import init_device_mesh

from source_code.capstone import seed
from source_code.capstone.runner import Runner, full_weights, piece, report
from source_code.capstone.runners_model import context_parallel, expert_parallel, pipeline
from source_code.mesh.reference import make_optimizer
from source_code.mesh.tp import build_2d
from source_code.workload import lm_loss


def mesh_2d(names: tuple, shape=(2, 2)):
    return init_device_mesh("cpu", shape, mesh_dim_names=names)


def fsdp_tp(path, lr: float, dp: int = 2, tp: int = 2) -> Runner:
    mesh = mesh_2d(("dp", "tp"), (dp, tp))
    model = build_2d(seed.load_seed(path), mesh)
    opt = make_optimizer(model.parameters(), lr)
    me, dp_group = mesh["dp"].get_local_rank(), mesh["dp"].get_group()

    def step(x, y, count):
        xs, ys = piece((x, y), me, dp)
        loss = lm_loss(model(xs), ys, count)
        (loss * dp).backward()               # FSDP2 averages over "dp": undone
        opt.step()
        opt.zero_grad()
        return report(loss, dp_group)
    return Runner(step, lambda: full_weights(model))


def dp_cp(path, lr: float, dp: int = 2, cp: int = 2, sync=None) -> Runner:
    """``sync(model, dp_group, cp_group)`` replaces the gradient sums (notebook 19's exercise)."""
    mesh = mesh_2d(("dp", "cp"), (dp, cp))
    return context_parallel(path, lr, mesh["cp"].get_group(), mesh["dp"].get_local_rank(), dp,
                            mesh["dp"].get_group(), sync)


def ep_dp(path, lr: float, dp: int = 2) -> Runner:
    return expert_parallel(path, lr, dp)


def pp_dp(path, lr: float, dp: int = 2, pp: int = 2, schedule: str = "1f1b") -> Runner:
    mesh = mesh_2d(("dp", "pp"), (dp, pp))
    return pipeline(path, lr, schedule, ranks=mesh["pp"].mesh.tolist(), group=mesh["pp"].get_group(),
                    dp_group=mesh["dp"].get_group(), dp_index=mesh["dp"].get_local_rank(), dp=dp)


def build(name: str, path, lr: float) -> Runner:
    return {"FSDP x TP": lambda: fsdp_tp(path, lr),
            "DP x CP": lambda: dp_cp(path, lr),
            "EP x DP": lambda: ep_dp(path, lr),
            "PP x DP": lambda: pp_dp(path, lr)}[name]()


NAMES = ("FSDP x TP", "DP x CP", "EP x DP", "PP x DP")
