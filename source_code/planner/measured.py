"""What the workshop's runs actually hold and send, counted on real processes.

``measure_all`` (run on 4 ranks by processes.spawn) trains the workshop's TransformerLM one
AdamW step in each configuration of ``CONFIGS`` and counts, on rank 0:

* the bytes of its local parameters, gradients and optimizer state after the step
  (measure.state_bytes: a DTensor counts its local shard);
* the bytes autograd saved for backward in the forward (parameters excluded);
* the payload of every collective of forward + backward, by kind (``CollectiveCounter``:
  c10d's collectives, issued by DDP and FSDP2, the functional collectives that DTensor's
  tensor parallelism issues, and the sends of a pipeline).

"pp_dp" is a 2-stage GPipe pipeline (torch.distributed.pipelining, 2 micro-batches) whose
stages are replicated twice, gradients summed with one all-reduce per stage
(mesh/pipeline3d.py without tp); its activations are not counted (the schedule keeps them).

"zero1_m2", "zero2_m2", "fsdp_m2" accumulate the gradients of 2 micro-batches per step over 4
ranks (planner/accumulation.py for ZeRO-1/2, FSDP2 for ZeRO-3): their collectives are counted
over the whole step, optimizer step included (ZeRO-1's reduce-scatter and ZeRO-1/2's
all-gather happen there), their gradients after it, their activations in one micro-batch.

Everything lives on this rank's device (``distributed.context().device``): the CPU when
planner/check.py spawns the 4 ranks with ``device="cpu"``, one GPU per rank (CUDA meshes, DDP
with device_ids) when spawned with ``device="auto"`` on a node with 4 GPUs. Bytes of tensors
and payloads of collectives do not depend on the device.
"""
from __future__ import annotations


import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.parallel import DistributedDataParallel as DDP

from source_code.distributed import context
from source_code.mesh.tp import apply_fsdp, apply_tp, build_2d
from source_code.workload import lm_loss
from source_code.planner.spec import Config
from source_code import workload
from source_code.measure import CommCounter, local, state_bytes, tensor_bytes

# name -> (dp, tp, ZeRO stage, pp, micro-batches per step and pipeline) on 4 ranks
CONFIGS = {"ddp": (4, 1, 0, 1, 1), "fsdp": (4, 1, 3, 1, 1), "tp": (1, 4, 0, 1, 1),
           "2d": (2, 2, 3, 1, 1), "pp_dp": (2, 1, 0, 2, 2),
           "zero1_m2": (4, 1, 1, 1, 2), "zero2_m2": (4, 1, 2, 1, 2), "fsdp_m2": (4, 1, 3, 1, 2)}
BATCH = 16

# functional collective -> (kind, payload in bytes from the input tensor and the group size)
_FUNCTIONAL = {
    "all_reduce": ("all_reduce", lambda b, n: b),
    "all_gather_into_tensor": ("all_gather", lambda b, n: b * n),
    "reduce_scatter_tensor": ("reduce_scatter", lambda b, n: b),
}


class CollectiveCounter(CommCounter):
    """CommCounter that also sees ``_c10d_functional`` ops; use ``payload`` (bytes by kind)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.name().split("::")[-1].split(".")[0]
        if func.namespace == "_c10d_functional" and name in _FUNCTIONAL:
            kind, size = _FUNCTIONAL[name]
            n = args[1] if name == "all_gather_into_tensor" else (
                args[2] if name == "reduce_scatter_tensor" else 1)
            self.calls[kind] += 1
            self.payload[kind] += size(args[0].numel() * args[0].element_size(), n)
            return func(*args, **(kwargs or {}))
        if func.namespace == "c10d" and name == "send":
            self.calls["send_recv"] += 1
            self.payload["send_recv"] += sum(t.numel() * t.element_size() for t in args[0])
            return func(*args, **(kwargs or {}))
        return super().__torch_dispatch__(func, types, args, kwargs)


def config_of(name: str) -> Config:
    dp, tp, zero, pp, m = CONFIGS[name]
    return Config(dp=dp, tp=tp, pp=pp, zero=zero, micro_batch=BATCH // (dp * m), global_batch=BATCH)


def build(name: str, cfg: dict):
    """(model, dp index of this rank) for one configuration on the 4 ranks, on this rank's device."""
    ctx = context()
    dp, tp = CONFIGS[name][:2]
    model = workload.build_model(cfg, 0, ctx.device)
    if name == "ddp":
        return DDP(model, device_ids=ctx.device_ids), dist.get_rank()
    if name == "fsdp":
        return apply_fsdp(model, init_device_mesh(ctx.device.type, (dp,))), dist.get_rank()
    if name == "tp":
        return apply_tp(model, init_device_mesh(ctx.device.type, (tp,))), 0
    mesh = init_device_mesh(ctx.device.type, (dp, tp), mesh_dim_names=("dp", "tp"))
    return build_2d(model, mesh), mesh["dp"].get_local_rank()


def measure_pipeline(name: str) -> dict:
    """One step of the pp x dp pipeline (after a first step that exchanges the shapes)."""
    from torch.distributed.pipelining import PipelineStage
    from source_code.mesh.pipeline3d import all_reduce_grads, make_schedule
    from source_code.pipeline.stages import TransformerStage
    dp, _, _, pp, micro_batches = CONFIGS[name]
    device = context().device
    mesh = init_device_mesh(device.type, (pp, dp), mesh_dim_names=("pp", "dp"))
    s, me = mesh["pp"].get_local_rank(), mesh["dp"].get_local_rank()
    module = TransformerStage(workload.build_model(workload.model_config(), 0, device), s, pp)
    stage = PipelineStage(module, s, pp, device, group=mesh["pp"].get_group())
    x, y = workload.global_batch(workload.sort_task(n=64), 0, BATCH)
    xs, ys = (t.to(device) for t in workload.rank_slice((x, y), me, dp))
    count = int((y != -100).sum())
    schedule = make_schedule(stage, micro_batches, lambda out, tgt: lm_loss(out, tgt, count))
    opt = torch.optim.AdamW(module.parameters(), lr=1e-3)

    def step():
        schedule.step(target=ys, losses=[]) if s == pp - 1 else schedule.step(xs)
        all_reduce_grads(module, mesh["dp"].get_group())

    step()                                   # the stages exchange shapes: not counted
    opt.zero_grad()
    counter = CollectiveCounter(dist.get_world_size())
    with counter:
        step()
    opt.step()
    out = {**state_bytes(module, opt), "activations": None,
           **{k: counter.payload.get(k, 0) for k in ("all_reduce", "all_gather", "reduce_scatter",
                                                     "send_recv")}}
    dist.barrier()
    return out


def measure_accumulated(name: str) -> dict:
    """One step of 2 micro-batches per rank, ZeRO-1/2 (AccumulatingZero) or ZeRO-3 (FSDP2)."""
    from source_code.planner.accumulation import AccumulatingZero
    dp, _, zero, _, m = CONFIGS[name]
    device = context().device
    model = workload.build_model(workload.model_config(), 0, device)
    if zero == 3:
        model = apply_fsdp(model, init_device_mesh(device.type, (dp,)))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    else:
        opt = AccumulatingZero(model, stage=zero, lr=1e-3)
    x, y = workload.global_batch(workload.sort_task(n=64), 0, BATCH)
    xs, ys = (t.to(device) for t in workload.rank_slice((x, y), dist.get_rank(), dp))
    count, saved = int((y != -100).sum()), []

    def pack(t):
        if not isinstance(t, nn.Parameter):
            saved.append(t)
        return t

    activations = None
    counter = CollectiveCounter(dist.get_world_size())
    with counter:
        for xm, ym in zip(xs.chunk(m), ys.chunk(m)):
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                loss = lm_loss(model(xm), ym, count)
            if activations is None:                       # one micro-batch's, as planned
                activations = tensor_bytes([local(t) for t in saved], exclude=list(model.parameters()))
            del saved[:]
            loss.backward()
        opt.step()
    out = {**state_bytes(model, opt), "activations": activations,
           **{k: counter.payload.get(k, 0) for k in ("all_reduce", "all_gather", "reduce_scatter")}}
    opt.zero_grad()
    dist.barrier()
    return out


def measure(name: str) -> dict:
    if CONFIGS[name][3] > 1:
        return measure_pipeline(name)
    if CONFIGS[name][4] > 1:
        return measure_accumulated(name)
    cfg = workload.model_config()
    dp = CONFIGS[name][0]
    model, me = build(name, cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = workload.global_batch(workload.sort_task(n=64), 0, BATCH)
    xs, ys = (t.to(context().device) for t in workload.rank_slice((x, y), me, dp))
    saved = []

    def pack(t):
        if not isinstance(t, nn.Parameter):
            saved.append(t)
        return t

    counter = CollectiveCounter(dist.get_world_size())
    with counter:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = lm_loss(model(xs), ys, int((y != -100).sum()))
        activations = tensor_bytes([local(t) for t in saved], exclude=list(model.parameters()))
        del saved[:]
        loss.backward()
    opt.step()
    out = {**state_bytes(model, opt), "activations": activations,
           **{k: counter.payload.get(k, 0) for k in ("all_reduce", "all_gather", "reduce_scatter")}}
    opt.zero_grad()
    dist.barrier()
    return out


def measure_all(names=tuple(CONFIGS)) -> dict:
    """{config name -> measured bytes} (rank 0's; every rank runs every configuration)."""
    torch.manual_seed(0)
    return {name: measure(name) for name in names}
