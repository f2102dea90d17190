"""Model-parallel configurations over all the ranks: each rank holds a part of the model.

* "TP (own)": tensor_parallel.model.TPTransformerLM (notebook 11): Megatron's column/row cuts;
* "TP (DTensor)": tensor_parallel.dtensor.parallelize (parallelize_module);
* "PP GPipe", "PP 1F1B": the own schedules of notebook 10 (pipeline.schedules.run_step), one
  stage per rank, 4 microbatches; the last stage computes the loss;
* "CP ring": cp_model.cp_logits (ring attention of notebook 13), gradients summed;
* "EP": the MoE TransformerLM with expert_parallel.ep_dp.to_expert_parallel (notebook 14).

Every loss is the summed cross-entropy / the global number of valid targets (lm_loss).
"""
from __future__ import annotations

import functools

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from source_code.capstone import seed
from source_code.capstone.cp_model import cp_logits, my_tokens
from source_code.capstone.runner import Runner, full_weights, piece, report, sum_gradients
from source_code.context_parallel.comm import Ring
from source_code.distributed import context
from source_code.expert_parallel import ep_dp
from source_code.mesh.reference import make_optimizer
from source_code.pipeline import simulator
from source_code.pipeline.comms import StageLink
from source_code.pipeline.schedules import run_step
from source_code.pipeline.stages import TransformerStage
from source_code.tensor_parallel import dtensor
from source_code.tensor_parallel.model import TPTransformerLM
from source_code.workload import lm_loss

MICROBATCHES = 4


def tp_own(path, lr: float) -> Runner:
    rank, world = dist.get_rank(), dist.get_world_size()
    model = TPTransformerLM(seed.load_seed(path), rank, world)
    opt = make_optimizer(model.parameters(), lr)

    def step(x, y, count):
        loss = lm_loss(model(x), y, count)        # every rank: the whole batch, its heads
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.item()
    return Runner(step, lambda: gather_own_tp(model))


@torch.no_grad()
def gather_own_tp(model) -> dict:
    """name -> full tensor: the row or column slices of the ranks put back together."""
    out = {}
    for name, p in model.named_parameters():
        owner = getattr(p, "owner", None)
        if owner is None:
            out[name] = p.detach().clone()
            continue
        parts = [torch.empty_like(p) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, p.detach().contiguous())
        out[name] = torch.cat(parts, dim=0 if owner[0] == "rows" else 1)
    return out


def tp_dtensor(path, lr: float) -> Runner:
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = dtensor.parallelize(seed.load_seed(path), mesh)
    opt = make_optimizer(model.parameters(), lr)

    def step(x, y, count):
        loss = lm_loss(model(x), y, count)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.item()
    return Runner(step, lambda: full_weights(model))


def pipeline(path, lr: float, schedule: str, ranks=None, group=None, dp_group=None,
             dp_index: int = 0, dp: int = 1) -> Runner:
    """One stage per rank of ``ranks`` (default: all); with ``dp_group`` the stage's gradients
    are summed over the data-parallel copies of the stage, each on its 1/dp of the batch."""
    ranks = ranks or list(range(dist.get_world_size()))
    s, p = ranks.index(dist.get_rank()), len(ranks)
    full = seed.load_seed(path)
    stage = TransformerStage(full, s, p)
    link = StageLink(s, p, context().device, ranks=ranks, group=group)
    opt = make_optimizer(stage.parameters(), lr)
    order = simulator.stage_order(schedule, p, MICROBATCHES, s)
    dim = full.tok.embedding_dim

    def step(x, y, count):
        x, y = piece((x, y), dp_index, dp)
        rep = run_step(stage, order, link, (x.shape[0] // MICROBATCHES, x.shape[1], dim),
                       inputs=list(x.chunk(MICROBATCHES)) if s == 0 else None,
                       targets=list(y.chunk(MICROBATCHES)) if s == p - 1 else None,
                       loss_fn=functools.partial(lm_loss, n_valid=count))
        if dp_group is not None:
            sum_gradients(stage.parameters(), dp_group)
        opt.step()
        opt.zero_grad()
        if s != p - 1:
            return None
        mine = torch.tensor([sum(rep["losses"])])
        return report(mine, dp_group) if dp_group is not None else mine.item()
    return Runner(step, lambda: dict(zip(stage.source_names, (q.detach().clone() for q in stage.parameters()))))


def context_parallel(path, lr: float, cp_group=None, dp_index: int = 0, dp: int = 1,
                     dp_group=None, sync=None) -> Runner:
    """Ring attention over ``cp_group`` (default: all ranks); gradients summed over ALL ranks
    (the cp group's tokens and the dp group's samples), or by ``sync(model, dp_group, cp_group)``."""
    ring = Ring(cp_group)
    model = seed.load_seed(path)
    opt = make_optimizer(model.parameters(), lr)

    def step(x, y, count):
        xs, ys = piece((x, y), dp_index, dp)
        loss = lm_loss(cp_logits(model, xs, ring), my_tokens(ys, ring), count)
        loss.backward()
        if sync is None:
            sum_gradients(model.parameters())
        else:
            sync(model, dp_group, cp_group)
        opt.step()
        opt.zero_grad()
        return report(loss)
    return Runner(step, lambda: full_weights(model))


def expert_parallel(path, lr: float, dp: int = 1) -> Runner:
    """The MoE model on a (dp, ep) mesh; each rank its 1/world of the samples (rank order)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = ep_dp.make_mesh("cpu", dp, world // dp)
    model = ep_dp.to_expert_parallel(seed.load_seed(path, "moe"), mesh["ep"].get_group())
    opt = make_optimizer(model.parameters(), lr)

    def step(x, y, count):
        xs, ys = piece((x, y), rank, world)
        loss = lm_loss(model(xs), ys, count)
        (loss * world).backward()
        ep_dp.reduce_gradients(model, mesh["dp"].get_group())   # divides by world: undone above
        opt.step()
        opt.zero_grad()
        return report(loss)
    return Runner(step, lambda: gather_experts(model), kind="moe")


@torch.no_grad()
def gather_experts(model) -> dict:
    """name -> full tensor with every expert under its number in the one-process model."""
    out = {}
    for name, p in model.named_parameters():
        if ".experts." not in name:
            out[name] = p.detach().clone()
            continue
        head, tail = name.split(".experts.")
        j, rest = tail.split(".", 1)
        expert = model.get_submodule(head).mine[int(j)]
        out[f"{head}.experts.{expert}.{rest}"] = p.detach().clone()
    return out


def build(name: str, path, lr: float) -> Runner:
    return {"TP (own)": lambda: tp_own(path, lr),
            "TP (DTensor)": lambda: tp_dtensor(path, lr),
            "PP GPipe": lambda: pipeline(path, lr, "gpipe"),
            "PP 1F1B": lambda: pipeline(path, lr, "1f1b"),
            "CP ring": lambda: context_parallel(path, lr),
            "EP": lambda: expert_parallel(path, lr)}[name]()


NAMES = ("TP (own)", "TP (DTensor)", "PP GPipe", "PP 1F1B", "CP ring", "EP")
