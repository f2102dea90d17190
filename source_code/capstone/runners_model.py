"""Model-parallel configurations over all the ranks: each rank holds a part of the model.

* "TP (own)": tensor_parallel.model.TPTransformerLM (notebook 11): Megatron's column/row cuts;
* "TP (DTensor)": tensor_parallel.dtensor.parallelize (parallelize_module);
* "TP + SP (DTensor)": the same with sequence parallelism: LayerNorms and the residual stream
  on t/n tokens per rank, all-gathered into attention and the MLP, reduce-scattered out;
* "CP ring": cp_model.cp_logits (ring attention of notebook 13), gradients summed;
* "EP": the MoE TransformerLM with expert_parallel.ep_dp.to_expert_parallel (notebook 14).

Tensor-parallel ranks read the same tokens: their data group is one rank, so the count is the
local one. Context-parallel ranks hold other tokens of the same samples: the count is summed
over the context-parallel group, and so are the gradients.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from source_code.capstone import seed
from source_code.capstone.cp_model import cp_logits, my_tokens
from source_code.capstone.loss import global_token_count, global_token_loss, local_token_count
from source_code.capstone.runner import Runner, Spec, full_weights, mesh, piece, report, sum_and_step
from source_code.context_parallel.comm import Ring
from source_code.expert_parallel import ep_dp
from source_code.mesh.reference import make_optimizer
from source_code.tensor_parallel import dtensor
from source_code.tensor_parallel.model import TPTransformerLM


def _same_tokens(model, opt) -> Runner:
    """A step where every rank reads the whole batch (its part of the model)."""
    def step(x, y):
        loss = global_token_loss(model(x), y, local_token_count([y]))   # every rank: all tokens
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.item()
    return step


def tp_own(spec: Spec) -> Runner:
    rank, world = dist.get_rank(), dist.get_world_size()
    model = TPTransformerLM(seed.load_seed(spec.path, dtype=spec.dtype), rank, world)
    return Runner(_same_tokens(model, make_optimizer(model.parameters(), spec.lr)),
                  lambda: gather_own_tp(model))


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


def tp_dtensor(spec: Spec, sequence_parallel: bool = False) -> Runner:
    model = dtensor.parallelize(seed.load_seed(spec.path, dtype=spec.dtype),
                                mesh((dist.get_world_size(),), ("tp",)), sequence_parallel)
    return Runner(_same_tokens(model, make_optimizer(model.parameters(), spec.lr)),
                  lambda: full_weights(model))


def context_parallel(spec: Spec) -> Runner:
    """Ring attention over all ranks: every rank its tokens of every sample."""
    ring = Ring(None)
    model = seed.load_seed(spec.path, dtype=spec.dtype)
    opt = make_optimizer(model.parameters(), spec.lr)

    def step(x, y):
        ys = my_tokens(y, ring)                                          # my tokens' targets
        loss = global_token_loss(cp_logits(model, x, ring), ys, global_token_count([ys]))
        return sum_and_step(loss, model, opt)
    return Runner(step, lambda: full_weights(model))


def expert_parallel(spec: Spec, dp: int = 1) -> Runner:
    """The MoE model on a (dp, ep) mesh; each rank its 1/world of the samples (rank order).
    Every rank routes its own tokens: the data group is all ranks."""
    rank, world = dist.get_rank(), dist.get_world_size()
    grid = mesh((dp, world // dp), ("dp", "ep"))
    model = ep_dp.to_expert_parallel(seed.load_seed(spec.path, "moe", spec.dtype), grid["ep"].get_group())
    opt = make_optimizer(model.parameters(), spec.lr)

    def step(x, y):
        xs, ys = piece((x, y), rank, world)
        loss = global_token_loss(model(xs), ys, global_token_count([ys]))
        (loss * world).backward()
        ep_dp.reduce_gradients(model, grid["dp"].get_group())   # divides by world: undone above
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


ROWS = {"TP (own)": tp_own,
        "TP (DTensor)": tp_dtensor,
        "TP + SP (DTensor)": lambda s: tp_dtensor(s, sequence_parallel=True),
        "CP ring": context_parallel,
        "EP": expert_parallel}
