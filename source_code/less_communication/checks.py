"""The runs of notebook 18 that put a slow link on this machine: slept, or waited out in flight.

Both take the link's time from a step time measured in the same run, so that their margins
hold on a fast or slow, quiet or loaded machine:

* ``slow_link_check``: DDP steps alternately on the local link and on a link whose all-reduce
  takes ``SLEPT_STEPS`` times the measured step (``SlowLink(sleep=True)``): per pair the
  measured extra time of the slow step, against the time the model charged it;
* ``streaming_overlap``: streaming DiLoCo for two rounds three ways, ``sync`` (each outer step
  at once), ``tau0`` (the all-reduce in flight, waited at once) and ``overlap`` (waited
  ``delay`` steps later, mix 0.5); the last two on a link whose all-reduce takes
  ``IN_FLIGHT_SHARE`` of the tau steps' compute measured in the ``sync`` run (``LinkInFlight``):
  tau steps of compute hide it, waiting at once shows all of it;
* ``bf16_on_this_backend``: a few steps with torch's bf16 hook (older gloo builds refuse).
"""
from __future__ import annotations

import statistics

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from source_code import workload
from source_code.distributed import context
from source_code.less_communication import links, tasks
from source_code.less_communication.harness import batch, build_model, train
from source_code.less_communication.slow_link import LinkInFlight, SlowLink
from source_code.less_communication.streaming import StreamingDiLoCo
from source_code.measure import clock

SLEPT_STEPS = 20        # the slept link's all-reduce: this many measured steps
IN_FLIGHT_SHARE = 0.4   # the in-flight link's all-reduce: this share of tau steps' compute


def _ddp_step(ddp, opt, x, y, ctx) -> float:
    dist.barrier()
    start = clock(ctx.device)
    loss = workload.loss_fn(ddp, x, y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    dist.barrier()                       # a step ends when every rank is done
    return clock(ctx.device) - start


def slow_link_check(s: dict) -> dict:
    """Per pair of DDP steps: fast (local link), slow (the link slept); the medians. Every step,
    the calibrating ones included, runs the same way: DDP's own all-reduce (torch's
    ``allreduce_hook``) inside one ``SlowLink``, entered for the hook's call only, so that the
    step time the link is set from is the step time measured against it."""
    ctx = context()
    rank, world = dist.get_rank(), dist.get_world_size()
    dataset = tasks.train_set(s["task"], s["seed"])
    model = build_model(s, ctx.device)
    ddp = DDP(model, device_ids=ctx.device_ids)
    wire = SlowLink(world, "node", sleep=False)               # counts and charges, sleeps when told
    ddp.register_comm_hook(None, wire.counted(default_hooks.allreduce_hook))
    opt = torch.optim.AdamW(model.parameters(), lr=s["lr"])
    batches = (batch(dataset, k, s, s["seed"], rank, world, ctx.device) for k in range(10**6))
    first = [_ddp_step(ddp, opt, *next(batches), ctx) for _ in range(2 + s["check_steps"])]
    step_s = torch.tensor(statistics.median(first[2:]))     # the first two build DDP's buckets
    dist.all_reduce(step_s, op=dist.ReduceOp.MAX)           # one link for every rank
    wire.link = links.latency_link(SLEPT_STEPS * float(step_s), world, "slept")
    fast, slow, charged = [], [], []
    for k in range(2 * s["check_steps"]):
        wire.sleep = k % 2 == 1
        before = wire.simulated_s
        took = _ddp_step(ddp, opt, *next(batches), ctx)
        (slow if wire.sleep else fast).append(took)
        if wire.sleep:
            charged.append(wire.simulated_s - before)           # barriers are not counted: no data
    extra = statistics.median(b - a for a, b in zip(fast, slow))
    return {"step_s": float(step_s), "fast_s": fast, "slow_s": slow, "charged_s": charged,
            "extra_s": extra, "model_s": statistics.median(charged), "slept_steps": SLEPT_STEPS}


def streaming_overlap(s: dict, start: dict) -> dict:
    """Two rounds (2 H steps) of streaming DiLoCo (fp32), three ways; per way: losses, wall
    time, the link's modelled seconds, the part of them not hidden by compute (uncovered) and
    the time really waited (exposed), the median compute time of a step."""
    ctx = context()
    world = dist.get_world_size()
    method = f"streaming-strided-fp32-{s['every']}"
    out, link = {}, None
    for name, delay, mix in (("sync", None, 0.0), ("tau0", 0, 0.0), ("overlap", s["delay"], 0.5)):
        wire = LinkInFlight(world, link, ctx.device) if link else None

        def make(model, delay=delay, mix=mix, wire=wire):
            kw = {"send": wire} if wire else {}
            return StreamingDiLoCo(model.parameters(), s["every"], s["fragments"], s["outer_lr"],
                                   s["outer_momentum"], delay=delay, mix=mix, **kw)
        dist.barrier()
        t0 = clock(ctx.device)
        run = train(method, s, start, steps=2 * s["every"], make_sync=make)
        step_s = torch.tensor(statistics.median(run["compute_s"]))
        dist.all_reduce(step_s, op=dist.ReduceOp.MIN)                # one link for every rank
        out[name] = {"loss": run["loss"], "eval": run["eval"], "wall_s": clock(ctx.device) - t0,
                     "exposed_s": wire.exposed_s if wire else 0.0, "modelled_s": wire.modelled_s if wire else 0.0,
                     "uncovered_s": wire.uncovered_s if wire else 0.0,
                     "sends": wire.count if wire else 0, "compute_s": float(step_s), "ops": run["ops"]}
        if link is None:          # from the synchronous run: a link tau steps of compute hide
            seconds = IN_FLIGHT_SHARE * max(s["delay"], 1) * float(step_s)
            link = links.latency_link(seconds, world, "in flight")
            out["link_s"] = seconds
    return out


def bf16_on_this_backend(s: dict) -> dict:
    """A few steps with bf16_compress_hook: did this backend all-reduce bf16, and how many bytes?"""
    try:
        run = train("bf16", s, steps=s["bf16_steps"])
        return {"ok": True, "bytes_per_step": run["bytes_per_step"], "loss": run["loss"][-1]}
    except Exception as err:     # gloo builds without bf16 all-reduce fail here: say how
        return {"ok": False, "error": f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"}
