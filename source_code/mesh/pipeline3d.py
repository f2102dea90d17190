"""3D parallelism: pipeline ("pp") x data ("dp") x tensor ("tp") on one mesh of pp*dp*tp ranks.

    mesh = init_device_mesh("cuda", (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))   # or "cpu"

* pp: the TransformerLM is cut into ``pp`` stages (pipeline.stages.TransformerStage); the ranks
  that share a (dp, tp) coordinate form one pipeline, ``PipelineStage(..., group=mesh["pp"])``
  and ``ScheduleGPipe`` send the activations and gradients of ``m`` microbatches between them;
* tp: every stage's blocks are tensor-parallel on mesh["tp"] (tp.apply_tp);
* dp: after the schedule's backward, the gradients of a stage are summed over mesh["dp"] with
  ONE all-reduce of a flat buffer (plain data parallelism; each rank keeps the full optimizer
  state of its (pp, tp) shard).

The loss of a microbatch is its summed cross-entropy / the global batch's scored targets
(reference.py), so microbatches and dp slices add up to the one-process gradient.

    python -m source_code.mesh.pipeline3d                       # 8 processes (2 x 2 x 2), the parity line
    WORKSHOP_DEVICE=cpu python -m source_code.mesh.pipeline3d   # on the CPU on purpose

Every rank computes on its device (``distributed.context().device``), and so does its
one-process reference: on a node with 8 GPUs one GPU per process (TF32 off, tolerance 1e-5:
reference.exact), otherwise all 8 on the CPU with gloo (tolerance 1e-6), as the device policy
decides and says in one line. Notebook 12 spawns ``run_3d`` with ``device="cpu"``.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from source_code import torch_versions
from source_code.distributed import context
from source_code.errors import run_main
from source_code.mesh import reference
from source_code.mesh.parity import full_weights, quiet_redistribute_warnings
from source_code.mesh.tp import apply_tp
from source_code.pipeline.stages import TransformerStage
from source_code.workload import lm_loss
from source_code import workload


def build_stage(cfg: dict, seed: int, mesh, device="cpu"):
    """This rank's stage module (TP applied) on ``device`` and its PipelineStage."""
    from torch.distributed.pipelining import PipelineStage
    pp, stage = mesh["pp"].size(), mesh["pp"].get_local_rank()
    module = TransformerStage(workload.build_model(cfg, seed, device), stage, pp)
    apply_tp(module, mesh["tp"])
    # no input_args: the stages exchange their shapes on the first step (given by hand, this
    # torch computed no input gradient on the last stage)
    return module, PipelineStage(module, stage, pp, torch.device(device), group=mesh["pp"].get_group())


def make_schedule(stage, microbatches: int, loss_fn):
    import inspect
    from torch.distributed.pipelining import ScheduleGPipe
    kwargs = {"loss_fn": loss_fn}
    if "scale_grads" in inspect.signature(ScheduleGPipe.__init__).parameters:
        kwargs["scale_grads"] = False   # our loss already carries the 1/(global count)
    return ScheduleGPipe(stage, microbatches, **kwargs)


def all_reduce_grads(module, group) -> None:
    """Sum this stage's gradients (their local shards) over the dp group in one flat buffer."""
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    local = [g.to_local() if hasattr(g, "to_local") else g for g in grads]
    flat = torch.cat([g.reshape(-1) for g in local])
    dist.all_reduce(flat, group=group)
    offset = 0
    for g in local:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def run_3d(pp: int = 2, dp: int = 2, tp: int = 2, steps: int = 2, batch_size: int = 16,
           microbatches: int = 2, lr: float = 0.1, seed: int = 0, dim: int = 64,
           layers: int = 2, heads: int = 4) -> dict:
    """Train on a pp x dp x tp mesh (call on all ranks); every rank compares its stage's
    weights with the one-process reference. Returns {"max_abs_diff", "loss_diff" (last stage,
    else 0.0), "coords", "device", "tol"}."""
    quiet_redistribute_warnings()
    device = context().device
    tol = reference.exact(device)
    cfg = workload.model_config(dim=dim, n_layers=layers, n_heads=heads)
    mesh = init_device_mesh(device.type, (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))
    stage_id, me = mesh["pp"].get_local_rank(), mesh["dp"].get_local_rank()
    data = reference.batches(steps, batch_size, seed)
    module, stage = build_stage(cfg, seed, mesh, device)
    opt = reference.make_optimizer(module.parameters(), lr)
    losses = []
    for x, y in data:
        xs, ys = (t.to(device) for t in workload.rank_slice((x, y), me, dp))
        count = reference.n_valid(y)
        schedule = make_schedule(stage, microbatches, lambda out, tgt: lm_loss(out, tgt, count))
        if stage_id == pp - 1:
            parts: list = []
            schedule.step(target=ys, losses=parts) if stage_id > 0 else schedule.step(xs, target=ys, losses=parts)
            total = torch.stack([v.detach() for v in parts]).sum().reshape(1)
            dist.all_reduce(total, group=mesh["dp"].get_group())
            losses.append(total.item())
        else:
            schedule.step(xs)
        all_reduce_grads(module, mesh["dp"].get_group())
        opt.step()
        opt.zero_grad()
    got = full_weights(module)
    want, ref_losses = reference.train_reference(cfg, seed, data, lr, device)
    diff = max((got[n] - want[src]).abs().max().item()
               for n, src in zip(got, module.source_names))
    loss_diff = max((abs(a - b) for a, b in zip(losses, ref_losses)), default=0.0)
    coords = tuple(int(c) for c in (mesh["pp"].get_local_rank(), me, mesh["tp"].get_local_rank()))
    return {"max_abs_diff": diff, "loss_diff": loss_diff, "coords": coords,
            "device": device.type, "tol": tol}


def main(argv=None):
    import time
    from source_code.processes import spawn
    from source_code.device_policy import choose
    torch_versions.require("gpipe", choose(0, 8).device)   # 2.9 on gloo: one line, not an abort
    start = time.perf_counter()
    results = spawn(run_3d, 8)   # the device policy decides (WORKSHOP_DEVICE=cpu: the CPU)
    worst = max(r["max_abs_diff"] for r in results)
    loss = max(r["loss_diff"] for r in results)
    print(f"parity: mesh=pp2xdp2xtp2 device={results[0]['device']} loss_diff={loss:.3g} "
          f"max_abs_diff={worst:.3g} tol={results[0]['tol']:g} "
          f"seconds={time.perf_counter() - start:.1f}")
    return 0 if worst <= results[0]["tol"] else 1


if __name__ == "__main__":
    run_main(main)
