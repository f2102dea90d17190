"""Every method of notebook 18 trained in one process group, on the same batches, counted.

``experiment(settings)`` runs on every rank (under ``processes.spawn`` or ``train.py`` under
torchrun) and trains, one after the other, the same TransformerLM (same seed) on the same
global batches of the task ``settings["task"]`` (tasks.py: the generated sort task by default,
or the markov task, whose loss has a floor above 0) with each method of ``methods(settings)``:

    ddp                            DDP with AdamW, the baseline of the local methods
    ddp-sgd, fp16, bf16            DDP with SGD + momentum (PowerSGD's setting): no hook, or
                                   the cast-and-all-reduce hooks
    powersgd, powersgd-no-ef,      the same with PowerSGD by hand with / without error
    torch-powersgd                 feedback, and with torch's PowerSGD hook
    local-sgd-H, diloco-H          H local AdamW steps, then an average / an outer step
    streaming-H, streaming-fp16-H  streaming DiLoCo in F fragments, fp32 / fp16 pseudo-gradients

Each step runs inside ``SlowLink`` (counting only: ``sleep`` off), so every step keeps its
collectives (kind, bytes) and its compute time (wall time minus the time its collectives
took here): the run can then be replayed on any link (``replay_time``). ``streaming_overlap``
runs streaming DiLoCo with its all-reduces in flight on a slowed link (``LinkInFlight``), to
measure how much of the link the inner steps hide; ``floor_runs`` trains DDP and DiLoCo at H
once more on ``floor_task`` (the markov task), where a relative loss gap means something;
``goals_only`` trains only what the entry point's summary line needs. Losses are the workers'
training losses, averaged over ranks; ``eval`` is the held-out loss of the model each worker
ends with, averaged over ranks (``evals``: the same every ``eval_every`` steps); ``floor`` is
the task's floor (``floors``). ``slow_link_check`` alternates DDP steps on the local link with
steps that sleep the chosen link's time, to compare measured and modelled time.
Rank 0 returns the results as plain Python values; the other ranks return None.
"""
from __future__ import annotations

import statistics

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from source_code import workload
from source_code.distributed import context
from source_code.less_communication import compression, tasks
from source_code.less_communication.local_sgd import DiLoCo, LocalSGD, average_fp16
from source_code.less_communication.slow_link import LinkInFlight, SlowLink, replay
from source_code.less_communication.streaming import StreamingDiLoCo
from source_code.measure import clock

DEFAULTS = {"steps": 80, "batch": 32, "lr": 3e-3, "sgd_lr": None, "dim": 32, "layers": 2, "rank": 2, "every": 20,
            "sweep": (10, 40), "fragments": 4, "link": "inter-site", "check_steps": 5,
            "seed": 0, "bf16_steps": 4, "eval_every": 10, "delay": 2, "goals_only": False,
            "task": "sort", "floor_task": "markov"}


def settings_with(**changes) -> dict:
    unknown = set(changes) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unknown settings {sorted(unknown)}; known: {sorted(DEFAULTS)}")
    return {**DEFAULTS, **changes}


def methods(s: dict) -> list:
    h = s["every"]
    if s["goals_only"]:              # what the summary line's P, D and G need, nothing else
        return ["ddp", "ddp-sgd", "powersgd", f"diloco-{h}"]
    return (["ddp", "ddp-sgd", "fp16", "powersgd", "powersgd-no-ef", "torch-powersgd",
             f"local-sgd-{h}", f"diloco-{h}"] + [f"diloco-{k}" for k in s["sweep"] if k != h]
            + [f"streaming-fp16-{h}"])


SGD_METHODS = ("ddp-sgd", "fp16", "bf16", "powersgd", "powersgd-no-ef", "torch-powersgd")


def build_model(s: dict, device):
    cfg = workload.model_config(dim=s["dim"], n_layers=s["layers"], vocab_size=tasks.vocab_size(s["task"]),
                                max_len=tasks.LENGTH)
    return workload.build_model(cfg, s["seed"], device)


def _wrap(method: str, s: dict, model, ctx):
    """(module to call, object with after_inner_step or None) for ``method``."""
    name, _, h = method.rpartition("-")
    if method in compression.METHODS or method in ("ddp", "ddp-sgd"):
        ddp = DDP(model, device_ids=ctx.device_ids)
        state = compression.attach(ddp, "full" if method.startswith("ddp") else method,
                                   rank=s["rank"], seed=s["seed"])
        return ddp, state
    every = int(h)
    if name == "local-sgd":
        return model, LocalSGD(model.parameters(), every)
    if name == "diloco":
        return model, DiLoCo(model.parameters(), every)
    if name in ("streaming", "streaming-fp16"):
        kw = {"average": average_fp16} if name == "streaming-fp16" else {}
        return model, StreamingDiLoCo(model.parameters(), every, s["fragments"], **kw)
    raise ValueError(f"unknown method {method!r}")


def train(method: str, s: dict, steps: int | None = None, make_sync=None) -> dict:
    """``method`` on ``s``; ``make_sync(model)`` instead builds the object whose
    ``after_inner_step`` synchronises (and whose ``finish``, if any, ends the run)."""
    ctx = context()
    rank, world = dist.get_rank(), dist.get_world_size()
    steps = s["steps"] if steps is None else steps
    dataset = tasks.train_set(s["task"], s["seed"])
    held_out = tasks.held_out_set(s["task"], s["seed"]).tensors
    model = build_model(s, ctx.device)
    module, sync = (model, make_sync(model)) if make_sync else _wrap(method, s, model, ctx)
    hook_state = None if hasattr(sync, "after_inner_step") else sync
    sync = sync if hasattr(sync, "after_inner_step") else None
    sgd_lr = s["sgd_lr"] or tasks.SGD_LR[s["task"]]
    opt = (torch.optim.SGD(model.parameters(), lr=sgd_lr, momentum=0.9) if method in SGD_METHODS
           else torch.optim.AdamW(model.parameters(), lr=s["lr"]))
    losses, compute_s, ops, held, held_steps = [], [], [], [], []
    with SlowLink(world, s["link"]) as wire:
        for step in range(steps):
            x, y = workload.rank_slice(workload.global_batch(dataset, step, s["batch"], s["seed"]),
                                       rank, world)
            x, y = x.to(ctx.device), y.to(ctx.device)
            start, comm_before = clock(ctx.device), wire.measured_s
            loss = workload.loss_fn(module, x, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if sync is not None:
                sync.after_inner_step(step)
            compute_s.append(clock(ctx.device) - start - (wire.measured_s - comm_before))
            ops.append(wire.step())
            losses.append(loss.item())
            if step + 1 == steps and hasattr(sync, "finish"):
                sync.finish()                    # all-reduces still in flight
            if (step + 1) % s["eval_every"] == 0 or step + 1 == steps:
                with torch.no_grad():            # this worker's model on the held-out set
                    held.append(workload.loss_fn(model, *(t.to(ctx.device) for t in held_out)).item())
                held_steps.append(step + 1)
    if method == "torch-powersgd":
        _add_unseen_ops(ops, hook_state, world)
    # reporting, outside the ledger: the means over ranks of the curve and of the held-out losses
    t = torch.tensor(losses + held, dtype=torch.float64)
    dist.all_reduce(t)
    t /= world
    evals = list(zip(held_steps, t[steps:].tolist()))
    return {"method": method, "loss": t[:steps].tolist(), "eval": evals[-1][1], "evals": evals,
            "compute_s": compute_s, "ops": ops, "world": world,
            "bytes_per_step": wire_bytes(ops, world) / steps,
            "params": sum(p.numel() for p in model.parameters())}


def wire_bytes(ops, world: int) -> float:
    """Bytes one rank sends for these steps' collectives (a ring: 2 (n-1)/n of an all-reduce)."""
    return sum((2 if kind == "all_reduce" else 1) * (world - 1) / world * nbytes
               for step in ops for kind, nbytes in step)


def peak_sync_bytes(run: dict) -> int:
    """The most bytes (payload) any one step of ``run`` synchronised."""
    return max(sum(nbytes for _, nbytes in step) for step in run["ops"])


def _add_unseen_ops(ops, state, world) -> None:
    """torch's PowerSGD hook all-reduces the vectors in the hook, then P and Q in future
    callbacks, which run on gloo's thread (out of SlowLink's sight) or on this one, depending on
    timing. So each compressed step's ledger is made the same every time: the vectors'
    all-reduce as seen, then P and Q from the state's buffers (all of one bucket, fp32)."""
    if len(state.p_memory_dict) != 1:
        raise ValueError("the torch-powersgd ledger expects one DDP bucket; raise bucket_cap_mb")
    p = sum(t.numel() * t.element_size() for t in state.p_memory_dict.values())
    q = sum(t.numel() * t.element_size() for t in state.q_memory_dict.values())
    for step_ops in ops[state.start_powerSGD_iter:]:
        del step_ops[1:]
        step_ops.extend([("all_reduce", p), ("all_reduce", q)])


def slow_link_check(s: dict) -> dict:
    """DDP steps alternately on the local link and sleeping the chosen link's time: per pair,
    the measured extra time of the slow step and the time the model charged it."""
    ctx = context()
    rank, world = dist.get_rank(), dist.get_world_size()
    dataset = tasks.train_set(s["task"], s["seed"])
    model = build_model(s, ctx.device)
    ddp = DDP(model, device_ids=ctx.device_ids)
    opt = torch.optim.AdamW(model.parameters(), lr=s["lr"])
    fast, slow, charged = [], [], []
    for step in range(2 * s["check_steps"] + 2):
        sleep = step % 2 == 1
        x, y = workload.rank_slice(workload.global_batch(dataset, step, s["batch"], s["seed"]), rank, world)
        with SlowLink(world, s["link"], sleep=sleep) as wire:
            dist.barrier()
            start = clock(ctx.device)
            loss = workload.loss_fn(ddp, x.to(ctx.device), y.to(ctx.device))
            opt.zero_grad()
            loss.backward()
            opt.step()
            dist.barrier()               # a step ends when every rank is done
            took = clock(ctx.device) - start
        if step >= 2:                    # the first pair builds DDP's buckets
            (slow if sleep else fast).append(took)
            if sleep:
                charged.append(wire.simulated_s)      # barriers are not counted: not data
    extra = statistics.median(b - a for a, b in zip(fast, slow))
    return {"fast_s": fast, "slow_s": slow, "charged_s": charged, "extra_s": extra,
            "model_s": statistics.median(charged)}


def replay_time(run: dict, link, compute_s: float | None = None, scale: float = 1.0) -> list:
    """Cumulative simulated seconds after each step of ``run`` on ``link``: the median compute
    time of its steps (or ``compute_s``) plus the link time of each step's collectives, their
    bytes multiplied by ``scale`` (the same run for a model ``scale`` times larger)."""
    c = statistics.median(run["compute_s"]) if compute_s is None else compute_s
    out, total = [], 0.0
    for ops in run["ops"]:
        total += c + replay([(kind, nbytes * scale) for kind, nbytes in ops], link, run["world"])
        out.append(total)
    return out


def streaming_overlap(s: dict) -> dict:
    """Streaming DiLoCo (fp32) for two rounds (2 H steps) three ways: ``sync`` (each outer
    step at once), ``tau0`` (the all-reduce in flight, waited at once) and ``overlap`` (waited
    ``delay`` steps later, mix 0.5); the last two on ``link`` (``LinkInFlight``): its time waited
    out, less what the compute meanwhile hid. Per way: losses, wall time, exposed and modelled
    link seconds, the median compute time of a step."""
    ctx = context()
    out = {}
    for name, delay, mix in (("sync", None, 0.0), ("tau0", 0, 0.0), ("overlap", s["delay"], 0.5)):
        wire = LinkInFlight(dist.get_world_size(), s["link"], ctx.device)

        def make(model, delay=delay, mix=mix, wire=wire):
            return StreamingDiLoCo(model.parameters(), s["every"], s["fragments"], delay=delay,
                                   mix=mix, send=wire)
        dist.barrier()
        start = clock(ctx.device)
        run = train(f"streaming-{name}", s, 2 * s["every"], make_sync=make)
        out[name] = {"loss": run["loss"], "eval": run["eval"], "wall_s": clock(ctx.device) - start,
                     "exposed_s": wire.exposed_s, "modelled_s": wire.modelled_s, "sends": wire.count,
                     "compute_s": statistics.median(run["compute_s"]), "ops": run["ops"]}
    return out


def experiment(settings: dict | None = None) -> dict | None:
    s = settings_with(**(settings or {}))
    out = {"settings": s, "runs": {}, "floor": floors(s["task"], s["seed"])}
    if not s["goals_only"]:
        out["check"] = slow_link_check(s)
    for method in methods(s):
        out["runs"][method] = train(method, s)
    if not s["goals_only"]:
        out["bf16"] = bf16_on_this_backend(s)
        out["overlap"] = streaming_overlap(s)
        if s["floor_task"] and s["floor_task"] != s["task"]:
            out["floor_runs"] = floor_runs(s)
    return out if dist.get_rank() == 0 else None


def floors(task: str, seed: int) -> dict:
    """The task's floor: expected, and the true process's loss on the held-out set."""
    return {"task": task, "expected": tasks.expected_floor(task),
            "held_out": tasks.sample_floor(task, tasks.held_out_set(task, seed))}


def floor_runs(s: dict) -> dict:
    """DDP and DiLoCo at H once more, on ``floor_task`` (a task whose loss has a floor above 0)."""
    t = {**s, "task": s["floor_task"]}
    return {"floor": floors(t["task"], t["seed"]),
            "runs": {m: train(m, t) for m in ("ddp", f"diloco-{s['every']}")}}


def bf16_on_this_backend(s: dict) -> dict:
    """A few steps with bf16_compress_hook: did this backend all-reduce bf16, and how many bytes?"""
    try:
        run = train("bf16", s, steps=s["bf16_steps"])
        return {"ok": True, "bytes_per_step": run["bytes_per_step"], "loss": run["loss"][-1]}
    except Exception as err:     # gloo builds without bf16 all-reduce fail here: say how
        return {"ok": False, "error": f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"}
