"""Parity: the expert-parallel layer and model equal one process on the same global batch.

Run on every rank (``processes.spawn(harness.report, n, device="cpu")``, or from compare.py):

* ``layer_parity``: one MoE layer, top-1 and top-2, with and without capacity dropping, with a
  shared expert, and under a router skewed towards expert 0 dropless (no capacity) and with a
  capacity (``SKEWED``: the same input both times, for the dropped assignments and the rows
  each rank receives, counted from the dispatch all-to-all's splits). The
  reference is ``MoE`` on the whole batch with groups = n (router.py: capacity and balancing
  loss per rank's tokens). Each rank's loss is mean over its tokens of <y, g> (g a fixed
  random dL/dy) + 0.1 x the balancing loss; the reference's loss is the mean of the ranks'.
  Compared: the outputs of the rank's tokens, the input gradient, the router gradient (after
  the sum over ranks) and the gradients of the rank's experts. What each all-to-all moved comes
  back as counted from its buffers (wire.py).
* ``model_parity``: the MoE TransformerLM on the sort task over a (dp, ep) mesh, expert
  gradients reduced over "dp" and the rest over all ranks (ep_dp.py): logits, loss and every
  gradient against one process; once more with a shared expert per layer (replicated: its
  gradient is summed over all ranks).

The largest difference over everything (compare.parity_rows) is what compare.py prints as
``ep_max_abs_diff``. Rank 0 prints one line per case as it finishes (a notebook cell shows
them as they come).
"""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F

from source_code import device_policy
from source_code.distributed import context, print0
from source_code.expert_parallel import comm, ep_dp, router, wire
from source_code.expert_parallel.ep_layer import EPMoE
from source_code.expert_parallel.moe import MoE, aux_loss, moe_transformer
from source_code.parity import tolerance
from source_code import workload

CASES = [(1, None), (1, 1.0), (2, None), (2, 1.0)]   # (k, capacity factor); None: no dropping
SHARED = {"k": 2, "capacity_factor": 1.0, "n_shared": 1}                  # + one shared expert
SKEW = 2.0                                         # raises expert 0's logit by about this much
SKEWED = [{"k": 2, "capacity_factor": None, "skew": SKEW, "tokens_per_rank": 64},   # dropless
          {"k": 2, "capacity_factor": 1.25, "skew": SKEW, "tokens_per_rank": 64}]   # same input, capacity
AUX_COEF = 0.1


def max_diff(a, b) -> float:
    return (a.detach().float() - b.detach().float()).abs().max().item() if a.numel() else 0.0


def _layer_loss(y, g, layer):
    """mean over these tokens of <y, g> + AUX_COEF x the balancing loss."""
    return (y * g).sum(-1).mean() + AUX_COEF * layer.aux_loss


def layer_parity(k: int, capacity_factor, dim: int = 16, n_experts: int = 8, tokens_per_rank: int = 32,
                 seed: int = 0, reduce: bool = True, n_shared: int = 0, skew: float = 0.0) -> dict:
    """One MoE layer vs one process (see the module's docstring); ``reduce=False`` forgets to
    sum the router's (and shared experts') gradient over the ranks (the check must then fail);
    ``skew``: every token's logit of expert 0 raised by about that much."""
    rank, world = dist.get_rank(), dist.get_world_size()
    device = context().device
    if device.type == "cuda":
        device_policy.exact_math()                    # TF32 off: fp32 matmuls on both sides
    torch.manual_seed(seed)
    dense = MoE(dim, 2 * dim, n_experts, k, capacity_factor, groups=world, n_shared=n_shared).to(device)
    x = torch.randn(world * tokens_per_rank, 1, dim, device=device)      # (N, 1, d): one token per row
    g = torch.randn_like(x)
    if skew:
        with torch.no_grad():                          # feature 0 about 1 for every token, and
            x[..., 0] += 1.0                           # expert 0's logit weighs it by ``skew``
            dense.router.weight[0, 0] += skew
    ep = EPMoE(dense)                                  # copies of the router and my experts
    ref_x = x.clone().requires_grad_(True)
    ref_y = dense(ref_x)
    _layer_loss(ref_y, g, dense).backward()
    dropped = int((~dense_keep(dense, ref_x)).sum())

    mine = slice(rank * tokens_per_rank, (rank + 1) * tokens_per_rank)
    x_r = x[mine].clone().requires_grad_(True)
    with wire.recording() as calls:
        y = ep(x_r)
        _layer_loss(y, g[mine], ep).backward()
    if reduce:
        ep_dp.reduce_gradients(ep)                     # router summed over ranks; / world
    else:
        for p in ep.parameters():                      # broken: router (and shared experts)
            p.grad /= world                            # keep this rank's tokens only
    diffs = {"output": max_diff(y, ref_y[mine]),
             "input grad": max_diff(x_r.grad / world, ref_x.grad[mine]),
             "router grad": max_diff(ep.router.weight.grad, dense.router.weight.grad),
             "expert grads": max(max_diff(p.grad, q.grad) for j, e in enumerate(ep.mine)
                                 for p, q in zip(ep.experts[j].parameters(), dense.experts[e].parameters()))}
    if n_shared:
        diffs["shared grads"] = max(max_diff(p.grad, q.grad) for p, q in zip(ep.shared.parameters(),
                                                                          dense.shared.parameters()))
    aux = torch.tensor([ep.aux_loss.item()], dtype=torch.float64)
    dist.all_reduce(aux)                               # the mean of the ranks' = the reference's
    diffs["aux loss"] = abs(aux.item() / world - dense.aux_loss.item())
    print0(f"  {world} ranks, layer {case_name(k, capacity_factor, n_shared, skew)}: "
           f"max |diff| {max(diffs.values()):.1e}")
    return {"k": k, "capacity_factor": capacity_factor, "world": world, "dropped": dropped,
            "assignments": k * world * tokens_per_rank, "diffs": diffs, "n_shared": n_shared, "skew": skew,
            "tokens_per_rank": tokens_per_rank, "n_experts": n_experts,
            "calls": list(calls), "row_bytes": dim * x.element_size()}


def case_name(k: int, capacity_factor, n_shared: int = 0, skew: float = 0.0) -> str:
    return (f"top-{k}" + (f", router skewed {skew:g}" if skew else "")
            + (", dropless" if capacity_factor is None else f", capacity {capacity_factor:g}")
            + (f", {n_shared} shared expert{'s' * (n_shared > 1)}" if n_shared else ""))


def dense_keep(dense: MoE, x) -> torch.Tensor:
    """The keep mask (N, k) the reference used (routed again, no gradient)."""
    with torch.no_grad():
        rows = x.reshape(-1, x.shape[-1])
        return router.route(dense.router(rows), dense.k, dense.capacity_factor, dense.groups).keep


def model_parity(dp: int, ep: int, k: int = 2, capacity_factor=1.25, batch_per_rank: int = 2,
                 n_experts: int = 4, seed: int = 0, n_shared: int = 0) -> dict:
    """The MoE TransformerLM over a (dp, ep) mesh vs one process, one forward + backward."""
    rank, world = dist.get_rank(), dist.get_world_size()
    device = context().device
    cfg = workload.model_config(dim=32, n_layers=2, n_heads=4)
    x, y = workload.global_batch(workload.sort_task(n=256), 0, batch_per_rank * world, seed)
    x, y = x.to(device), y.to(device)
    reference = moe_transformer(cfg, n_experts, k, capacity_factor, groups=world, seed=seed,
                                n_shared=n_shared).to(device)
    mesh = ep_dp.make_mesh(device.type, dp, ep)
    model = ep_dp.to_expert_parallel(copy.deepcopy(reference), mesh["ep"].get_group())
    ref_logits = reference(x)
    ref_loss = _lm_loss(ref_logits, y, reference)
    ref_loss.backward()

    mine = slice(rank * batch_per_rank, (rank + 1) * batch_per_rank)   # mesh order = rank order
    logits = model(x[mine])
    loss = _lm_loss(logits, y[mine], model)
    loss.backward()
    groups = ep_dp.reduce_gradients(model, mesh["dp"].get_group())
    ref_params = dict(reference.named_parameters())
    worst_grad, worst_name = 0.0, ""
    for name, p in model.named_parameters():
        ref_name = _reference_name(name, model)
        d = max_diff(p.grad, ref_params[ref_name].grad)
        if d >= worst_grad:
            worst_grad, worst_name = d, name
    total = torch.tensor([loss.item()], dtype=torch.float64)
    dist.all_reduce(total)
    print0(f"  {world} ranks, model on mesh dp={dp} x ep={ep}" + (f", {n_shared} shared expert" if n_shared else "")
           + f": max |grad diff| {worst_grad:.1e}")
    return {"dp": dp, "ep": ep, "world": world, "mesh": mesh.mesh.tolist(), "n_shared": n_shared,
            "logits": max_diff(logits, ref_logits[mine]), "loss": abs(total.item() / world - ref_loss.item()),
            "grads": worst_grad, "worst": worst_name, "reduced": groups,
            "dp_group": mesh["dp"].mesh.tolist(), "ep_group": mesh["ep"].mesh.tolist()}


def _lm_loss(logits, y, model):
    ce = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100)
    return ce + AUX_COEF * aux_loss(model)


def _reference_name(name: str, model) -> str:
    """layers.0.mlp.experts.1.up.weight on an ep rank -> the full model's expert number."""
    if ".experts." not in name:
        return name
    head, tail = name.split(".experts.")
    j, rest = tail.split(".", 1)
    layer = model.get_submodule(head)
    return f"{head}.experts.{layer.mine[int(j)]}.{rest}"


def report(model_meshes=None) -> dict:
    """Every layer case and the model on every (dp, ep) of this world size; run on all ranks."""
    world = dist.get_world_size()
    meshes = model_meshes or [(world // ep, ep) for ep in (2, 4) if world % ep == 0]
    tol, why = tolerance(context().device)
    return {"world": world, "tol": tol, "why": why, "device": str(context().device),
            "layers": [layer_parity(k, cf) for k, cf in CASES] + [layer_parity(**SHARED)]
                      + [layer_parity(**case) for case in SKEWED],
            "models": [model_parity(dp, ep) for dp, ep in meshes] + [model_parity(world // 2, 2, n_shared=1)]}


def can_fail() -> dict:
    """For the tests: a correct case with unequal splits (gloo must carry them), the same case
    with the router's gradient left unreduced (must exceed the tolerance), and the message of
    an all-to-all handed splits that do not match its buffer (refused before any message)."""
    good = layer_parity(2, 1.0)
    bad = layer_parity(2, 1.0, reduce=False)
    try:
        comm.all_to_all(torch.zeros(3, 2), [1, 1], [1, 1])
        refused = ""
    except ValueError as err:
        refused = str(err)
    return {"good": good, "bad": bad, "tol": tolerance(context().device)[0], "refused": refused}

