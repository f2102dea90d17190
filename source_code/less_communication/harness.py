"""One method of notebook 18 trained in a process group, on the same batches as every other, counted.

``train(method, s, start)`` runs on every rank (under ``processes.spawn`` or ``train.py`` under
torchrun) and trains the same TransformerLM on the same global batches of the task
``s["task"]`` (tasks.py) with one method (its name parsed by ``spec``):

    ddp                                DDP with AdamW: the baseline of the local methods
    ddp-sgd, fp16, bf16                DDP with SGD and Nesterov momentum (PowerSGD's setting):
                                       no compression, or the cast-and-all-reduce hooks
    powersgd-rR, powersgd-no-ef-rR,    the same with PowerSGD at rank R by hand with / without
    torch-powersgd-rR                  error feedback, and torch's hook (the same first Q)
    ...-hb                             any SGD method with heavy-ball momentum instead
    local-sgd-H, diloco-H              H local AdamW steps, then an average / an outer step
                                       (s["outer_lr"], s["outer_momentum"]; ``-paper``: the
                                       paper's 0.7 and 0.9)
    streaming-PATTERN-BITS-H           streaming DiLoCo, fragments consecutive or strided, the
                                       pseudo-gradients sent in fp32, fp16 or e3m0 (4 bits)
    ...-scratch                        a local method that skips the pretrained start

**The pretrained start.** As in the DiLoCo paper (whose workers start from a model pretrained
with synchronous training) and as torch advises for PowerSGD (plain all-reduces until the
fast early phase is over), every method starts from the same model: ``pretrain`` trains it
``s["pretrain"]`` steps with DDP and AdamW. AdamW methods also start from its optimizer state
(so ``ddp`` is simply DDP trained on); the SGD methods start their SGD afresh. Then each method
trains ``s["steps"]`` more steps, on the global batches that follow: equal steps and equal
tokens for every method. A ``-scratch`` method trains pretrain + steps steps from the first.

**Counted.** Every collective of a method goes through ``SlowLink`` (a dispatch mode entered
only around the communication: DDP's hook, a synchronisation), so each step keeps its ops
(kind, bytes) and its compute time (wall time minus the time its collectives took here): the
run can be replayed on any link (``replay_time``). torch's PowerSGD hook all-reduces P and Q in
future callbacks that may run on gloo's thread, out of the mode's sight: its bytes are torch's
own count (``PowerSGDState.compression_stats``) and its run is not replayed.

**Evaluated when synchronised.** The held-out loss is taken every ``eval_every`` steps of a
model every worker holds: DDP's at any step, local SGD's and DiLoCo's right after a
synchronisation (the multiples of H), streaming DiLoCo's global copy (its fragments' outer
parameters) at any step; each rank scores half of the held-out set. Losses are averaged over
ranks; rank 0 gets the run as plain values (DiLoCo's also the norm of each averaged
pseudo-gradient, ``outer_norms``).
"""
from __future__ import annotations

import copy
import math
import re
import statistics
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from source_code import workload
from source_code.distributed import context
from source_code.less_communication import compression, lowbit, tasks
from source_code.less_communication.local_sgd import DiLoCo, LocalSGD, average
from source_code.less_communication.slow_link import SlowLink, replay
from source_code.less_communication.streaming import StreamingDiLoCo
from source_code.measure import clock

# outer_momentum: the paper's 0.9 remembers about 1 / (1 - 0.9) = 10 outer steps, a small part
# of the paper's runs; ours have 6 (steps / every), and 0.7 (about 3) was chosen by hand for an
# earlier version of this run (160 steps, batch 32; no record of that tuning is kept here; the
# notebook shows the paper's 0.9 beside it)
DEFAULTS = {"steps": 120, "pretrain": 40, "batch": 16, "lr": 3e-3, "sgd_lr": 0.05, "dim": 48,
            "layers": 2, "rank": 2, "every": 20, "sweep": (10, 40), "fragments": 4,
            "outer_lr": 0.7, "outer_momentum": 0.7, "link": "inter-site", "check_steps": 5, "seed": 0,
            "seeds": (0, 1, 2),
            "bf16_steps": 4, "eval_every": 20, "delay": 2, "goals_only": False, "task": "sort"}
AVERAGES = {"fp32": average, "fp16": lowbit.average_fp16, "e3m0": lowbit.average_e3m0}
NAME = re.compile(r"^(?P<kind>ddp|ddp-sgd|fp16|bf16|powersgd|powersgd-no-ef|torch-powersgd|local-sgd|diloco"
                  r"|streaming-(?P<pattern>consecutive|strided)-(?P<bits>fp32|fp16|e3m0))"
                  r"(?:-r(?P<rank>\d+))?(?:-(?P<every>\d+))?(?P<scratch>-scratch)?(?P<paper>-paper)?(?P<hb>-hb)?$")
PAPER_OUTER = (0.7, 0.9)    # DiLoCo's outer SGD: learning rate, Nesterov momentum (Douillard et al.)


def settings_with(**changes) -> dict:
    unknown = set(changes) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unknown settings {sorted(unknown)}; known: {sorted(DEFAULTS)}")
    return {**DEFAULTS, **changes}


def spec(method: str) -> dict:
    """What a method's name says: kind, rank, H, pattern, bits, scratch, heavy-ball."""
    m = NAME.match(method)
    if m is None:
        raise ValueError(f"unknown method {method!r}")
    d = m.groupdict()
    kind = d["kind"].split("-")[0] if d["kind"].startswith("streaming") else d["kind"]
    local = kind in ("local-sgd", "diloco", "streaming")
    if local != (d["every"] is not None) or (d["rank"] is not None) != ("powersgd" in kind):
        raise ValueError(f"method {method!r}: H goes with local methods, -rR with PowerSGD")
    sgd = kind in ("ddp-sgd", "fp16", "bf16", "powersgd", "powersgd-no-ef", "torch-powersgd")
    if (d["hb"] and not sgd) or (d["scratch"] and not local) or (d["paper"] and kind != "diloco"):
        raise ValueError(f"method {method!r}: -hb goes with SGD methods, -scratch with local ones, "
                         "-paper with DiLoCo")
    return {"kind": kind, "rank": int(d["rank"] or 0), "every": int(d["every"] or 0), "sgd": sgd,
            "pattern": d["pattern"], "bits": d["bits"], "scratch": bool(d["scratch"]),
            "paper": bool(d["paper"]), "heavy_ball": bool(d["hb"]), "local": local}


def build_model(s: dict, device, seed: int | None = None):
    cfg = workload.model_config(dim=s["dim"], n_layers=s["layers"], vocab_size=tasks.vocab_size(s["task"]),
                                max_len=tasks.LENGTH)
    return workload.build_model(cfg, s["seed"] if seed is None else seed, device)


def lr_factor(step: int, total: int) -> float:
    """The learning rate of global step ``step`` of ``total`` over the base rate: a cosine from 1
    down to a tenth (the papers' runs decay theirs too; a constant rate leaves the last losses
    jumping, and a comparison of two runs' last losses measures the jumps)."""
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(step, total) / total))


def set_lr(opt, base: float, step: int, total: int) -> None:
    """Set ``opt``'s learning rate for global step ``step`` of ``total`` (``lr_factor``)."""
    for group in opt.param_groups:
        group["lr"] = base * lr_factor(step, total)


def batch(dataset, step: int, s: dict, seed: int, rank: int, world: int, device):
    x, y = workload.rank_slice(workload.global_batch(dataset, step, s["batch"], seed), rank, world)
    return x.to(device), y.to(device)


def pretrain(s: dict, seed: int) -> dict:
    """The common start: DDP with AdamW for s["pretrain"] steps; the model's and AdamW's state."""
    ctx = context()
    model = build_model(s, ctx.device, seed)
    ddp = DDP(model, device_ids=ctx.device_ids)
    opt = torch.optim.AdamW(model.parameters(), lr=s["lr"])
    dataset = tasks.train_set(s["task"], s["seed"])
    for step in range(s["pretrain"]):
        set_lr(opt, s["lr"], step, s["pretrain"] + s["steps"])
        loss = workload.loss_fn(ddp, *batch(dataset, step, s, seed, dist.get_rank(), dist.get_world_size(), ctx.device))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {"model": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "adamw": opt.state_dict()}


def _setup(method: str, sp: dict, s: dict, model, ctx, wire: SlowLink, seed: int):
    """(module to call, synchroniser or None, PowerSGD state or None)."""
    if not sp["local"]:
        ddp = DDP(model, device_ids=ctx.device_ids)
        kind = {"ddp": "full", "ddp-sgd": "full"}.get(sp["kind"], sp["kind"])
        state = compression.attach(ddp, kind, rank=sp["rank"] or s["rank"], seed=seed,
                                   wrap=None if kind == "torch-powersgd" else wire.counted, counter=wire)
        return ddp, None, state
    h = sp["every"]
    if sp["kind"] == "local-sgd":
        return model, LocalSGD(model.parameters(), h), None
    if sp["kind"] == "diloco":
        norms = []

        def recorded(tensors):            # the averaged pseudo-gradient's norm, for the notebook
            average(tensors)
            norms.append(float(torch.sqrt(sum((t.double() ** 2).sum() for t in tensors))))
        outer = PAPER_OUTER if sp["paper"] else (s["outer_lr"], s["outer_momentum"])
        sync = DiLoCo(model.parameters(), h, *outer, average=recorded)
        sync.norms = norms
        return model, sync, None
    return model, StreamingDiLoCo(model.parameters(), h, s["fragments"], s["outer_lr"], s["outer_momentum"],
                                  average=AVERAGES[sp["bits"]], pattern=sp["pattern"]), None


@contextmanager
def agreed_model(model, sync):
    """The model every worker holds: for streaming DiLoCo its global copy, swapped in."""
    if not isinstance(sync, StreamingDiLoCo):
        yield model
        return
    pairs = [(p, g) for frag, glob in zip(sync.frags, sync.global_params) for p, g in zip(frag, glob)]
    saved = [p.detach().clone() for p, _ in pairs]
    with torch.no_grad():
        for p, g in pairs:
            p.copy_(g)
        try:
            yield model
        finally:
            for (p, _), v in zip(pairs, saved):
                p.copy_(v)


def _synchronised(sp: dict, local_step: int) -> bool:
    """After ``local_step`` steps (counted from the method's start), do the workers agree?"""
    return not sp["local"] or sp["kind"] == "streaming" or local_step % sp["every"] == 0


def train(method: str, s: dict, start: dict | None = None, seed: int | None = None,
          steps: int | None = None, make_sync=None) -> dict:
    """``method`` on ``s`` from ``start`` (``pretrain``'s; None: the initial model);
    ``make_sync(model)`` instead builds the object whose ``after_inner_step`` synchronises
    (and whose ``finish``, if any, ends the run). ``steps`` stops it early: its learning rate
    follows the whole run's schedule, so its steps are the first steps of the whole run."""
    ctx = context()
    rank, world = dist.get_rank(), dist.get_world_size()
    sp = spec(method)
    seed = s["seed"] if seed is None else seed
    start = None if sp["scratch"] else start
    first = s["pretrain"] if start else 0
    horizon = s["steps"] + (s["pretrain"] if sp["scratch"] else 0)     # the schedule's length
    steps = horizon if steps is None else steps
    dataset = tasks.train_set(s["task"], s["seed"])
    # each rank scores its share of the held-out sequences (every sequence of a task has the
    # same number of scored tokens, so the mean over ranks is the mean over the whole set)
    held_out = [t[rank::world].to(ctx.device) for t in tasks.held_out_set(s["task"], s["seed"]).tensors]
    model = build_model(s, ctx.device, seed)
    if start:
        model.load_state_dict(start["model"])
    wire = SlowLink(world, s["link"])
    module, sync, hook_state = (model, make_sync(model), None) if make_sync else _setup(method, sp, s, model, ctx, wire, seed)
    if sp["sgd"]:
        opt = torch.optim.SGD(model.parameters(), lr=s["sgd_lr"], momentum=0.9, nesterov=not sp["heavy_ball"])
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=s["lr"])
        if start:                                  # a copy: torch keeps the tensors it is handed
            opt.load_state_dict(copy.deepcopy(start["adamw"]))
    losses, compute_s, ops, held, held_steps = [], [], [], [], []

    def evaluate(step):
        with torch.no_grad(), agreed_model(model, sync) as agreed:
            held.append(workload.loss_fn(agreed, *held_out).item())
        held_steps.append(step)

    evaluate(first)
    base_lr = s["sgd_lr"] if sp["sgd"] else s["lr"]
    for i in range(steps):
        set_lr(opt, base_lr, first + i, first + horizon)
        x, y = batch(dataset, first + i, s, seed, rank, world, ctx.device)
        t0, comm0 = clock(ctx.device), wire.measured_s
        loss = workload.loss_fn(module, x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if sync is not None:
            with wire:
                sync.after_inner_step(i)
                if i + 1 == steps and hasattr(sync, "finish"):
                    sync.finish()                    # all-reduces still in flight
        compute_s.append(clock(ctx.device) - t0 - (wire.measured_s - comm0))
        ops.append(wire.step())
        losses.append(loss.item())
        if ((i + 1) % s["eval_every"] == 0 or i + 1 == steps) and _synchronised(sp, i + 1):
            evaluate(first + i + 1)
    # reporting, outside the ledger: the means over ranks of the curve and of the held-out losses
    t = torch.tensor(losses + held, dtype=torch.float64)
    dist.all_reduce(t)
    t /= world
    evals = list(zip(held_steps, t[steps:].tolist()))
    run = {"method": method, "seed": seed, "loss": t[:steps].tolist(), "eval": evals[-1][1], "evals": evals,
           "compute_s": compute_s, "ops": ops, "world": world, "first": first,
           "bytes_per_step": wire_bytes(ops, world) / steps, "params": sum(p.numel() for p in model.parameters()),
           "outer_norms": getattr(sync, "norms", None)}
    if sp["kind"] == "torch-powersgd":
        run.update(torch_counted(hook_state, steps, run["params"]), ops=None)
    return run


def torch_counted(state, steps: int, params: int) -> dict:
    """torch's own count of what its hook sent: numbers per compressed step (its stats), the
    plain steps' all-reduces of every gradient, as bytes per step on the wire (ring)."""
    _, _, after = state.compression_stats()
    compressed = steps - state.start_powerSGD_iter
    numbers = after / compressed                      # torch adds up every compressed bucket
    world = dist.get_world_size()
    wire = 2 * (world - 1) / world * 4 * (state.start_powerSGD_iter * params + compressed * numbers)
    return {"torch_numbers_per_step": numbers, "bytes_per_step": wire / steps}


def wire_bytes(ops, world: int) -> float:
    """Bytes one rank sends for these steps' collectives: a ring all-reduce sends 2 (n-1)/n of
    the buffer, an all-gather (n-1)/n of the gathered output."""
    return sum((2 if kind == "all_reduce" else 1) * (world - 1) / world * nbytes
               for step in ops for kind, nbytes in step)


def peak_sync_bytes(run: dict) -> int:
    """The most bytes (payload) any one step of ``run`` synchronised."""
    return max(sum(nbytes for _, nbytes in step) for step in run["ops"])


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
