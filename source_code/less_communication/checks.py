"""The runs of notebook 18 that put a slow link on this machine: slept, or waited out in flight.

Both take the link's time from a step time measured in the same run, so that their margins
hold on a fast or slow, quiet or loaded machine:

* ``slow_link_check``: DDP steps alternately on the local link and on a link whose all-reduce
  takes ``SLEPT_STEPS`` times the median of the fast steps so far (``SlowLink(sleep=True)``):
  per pair the measured extra time of the slow step, against the time the model charged it;
* ``streaming_overlap``: streaming DiLoCo for two rounds three ways, ``sync`` (each outer step
  at once), ``tau0`` (the all-reduce in flight, waited at once) and ``overlap`` (waited
  ``delay`` steps later, mix 0.5); the last two on a link whose all-reduce takes
  ``IN_FLIGHT_SHARE`` of tau steps' compute, set at every send from the steps measured so far
  in the same run (``LinkInFlight``): tau steps of compute hide it, waiting at once shows all
  of it, on a fast or a slow machine alike;
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
    """Pairs of DDP steps: fast (local link), then slow (the link slept); the medians. Before
    each slow step the link is set from the fast steps measured so far (the median, the larger
    of the two ranks'), so that a slept all-reduce takes ``SLEPT_STEPS`` of the very steps it is
    measured against. Every step runs the same way: DDP's own all-reduce (torch's
    ``allreduce_hook``) inside one ``SlowLink``, entered for the hook's call only."""
    ctx = context()
    rank, world = dist.get_rank(), dist.get_world_size()
    dataset = tasks.train_set(s["task"], s["seed"])
    model = build_model(s, ctx.device)
    ddp = DDP(model, device_ids=ctx.device_ids)
    wire = SlowLink(world, "node", sleep=False)               # counts and charges, sleeps when told
    ddp.register_comm_hook(None, wire.counted(default_hooks.allreduce_hook))
    opt = torch.optim.AdamW(model.parameters(), lr=s["lr"])
    batches = (batch(dataset, k, s, s["seed"], rank, world, ctx.device) for k in range(10**6))
    for _ in range(2):                                        # the first two build DDP's buckets
        _ddp_step(ddp, opt, *next(batches), ctx)
    fast, slow, charged, set_from = [], [], [], []
    for _ in range(s["check_steps"]):
        fast.append(_ddp_step(ddp, opt, *next(batches), ctx))
        step_s = torch.tensor(statistics.median(fast))
        dist.all_reduce(step_s, op=dist.ReduceOp.MAX)       # one link for every rank
        set_from.append(float(step_s))
        wire.link = links.latency_link(SLEPT_STEPS * float(step_s), world, "slept")
        wire.sleep = True
        before = wire.simulated_s
        slow.append(_ddp_step(ddp, opt, *next(batches), ctx))
        charged.append(wire.simulated_s - before)               # barriers are not counted: no data
        wire.sleep = False
    extra = statistics.median(b - a for a, b in zip(fast, slow))
    return {"set_from_s": set_from, "fast_s": fast, "slow_s": slow, "charged_s": charged,
            "extra_s": extra, "model_s": statistics.median(charged), "slept_steps": SLEPT_STEPS}


class _Paced(StreamingDiLoCo):
    """Streaming DiLoCo whose in-flight link is set, at every send, from the steps of this very
    run: ``IN_FLIGHT_SHARE`` x tau x the median compute between two synchronisation calls so
    far. Its last send, due after the run's end, is waited at once by ``finish`` (marked
    ``closing``): no step is left to hide it."""

    def __init__(self, *args, wire: LinkInFlight, tau: int, device, **kw):
        super().__init__(*args, send=wire, **kw)
        self.wire, self.tau, self.device = wire, tau, device
        self.step_s, self._left = [], clock(device)

    def after_inner_step(self, step: int) -> bool:
        self.step_s.append(clock(self.device) - self._left)    # the step since the last call returned
        seconds = IN_FLIGHT_SHARE * self.tau * statistics.median(self.step_s)
        self.wire.link = links.latency_link(seconds, self.wire.n, "in flight")
        synced = super().after_inner_step(step)
        self._left = clock(self.device)
        return synced

    def finish(self) -> None:
        self.wire.closing = True
        super().finish()


def streaming_overlap(s: dict, start: dict) -> dict:
    """Two rounds (2 H steps) of streaming DiLoCo (fp32), three ways; per way: losses, wall time,
    the median compute time of a step and, for the two in flight, each send's modelled link
    time, the part of it not hidden by compute (uncovered) and the time really waited (exposed)
    (``LinkInFlight.sends``). The in-flight ways set their link from their own steps (``_Paced``):
    how much tau steps hide is a ratio within one run, whatever the machine's speed or load."""
    ctx = context()
    world = dist.get_world_size()
    method = f"streaming-strided-fp32-{s['every']}"
    tau = max(s["delay"], 1)              # the link: a share of the compute of tau steps
    out = {}
    for name, delay, mix in (("sync", None, 0.0), ("tau0", 0, 0.0), ("overlap", s["delay"], 0.5)):
        wire = LinkInFlight(world, "node", ctx.device) if delay is not None else None

        def make(model, delay=delay, mix=mix, wire=wire):
            args = (model.parameters(), s["every"], s["fragments"], s["outer_lr"], s["outer_momentum"])
            if wire is None:
                return StreamingDiLoCo(*args)
            return _Paced(*args, delay=delay, mix=mix, wire=wire, tau=tau, device=ctx.device)
        dist.barrier()
        t0 = clock(ctx.device)
        run = train(method, s, start, steps=2 * s["every"], make_sync=make)
        out[name] = {"loss": run["loss"], "eval": run["eval"], "wall_s": clock(ctx.device) - t0,
                     "compute_s": statistics.median(run["compute_s"]), "ops": run["ops"],
                     "sends": wire.sends if wire else []}
    return out


def bf16_on_this_backend(s: dict) -> dict:
    """A few steps with bf16_compress_hook: did this backend all-reduce bf16, and how many bytes?"""
    try:
        run = train("bf16", s, steps=s["bf16_steps"])
        return {"ok": True, "bytes_per_step": run["bytes_per_step"], "loss": run["loss"][-1]}
    except Exception as err:     # gloo builds without bf16 all-reduce fail here: say how
        return {"ok": False, "error": f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"}
