"""Check and measurement harness for the pipeline lessons (not a lesson file itself).

Functions here run on every rank of a process group, one pipeline stage per rank, started by
``processes.spawn`` (notebook, tests) or inside the torchrun modules ``bubble`` and ``compare``:

* ``parity(schedule, m, work)``: one step of own naive / GPipe / 1F1B or a library schedule,
  compared with the unsplit model on the whole batch (loss and every gradient), with the
  tolerance for this device (``TOL`` on the CPU, more on a GPU: ``source_code.parity.tolerance``);
* ``timed_steps(schedules, m, steps, work)``: several steps of each schedule, interleaved,
  with the per-operation records of the own schedules (Gantt charts, bubble).

Every rank builds the same full model from one seed and keeps its slice, so the reference is
available everywhere without sending weights around.

    python -m source_code.pipeline.harness      # parity of every schedule, 2 processes
"""
from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from source_code import data, models
from source_code.device_policy import exact_math
from source_code.distributed import context
from source_code.parity import tolerance
from source_code.pipeline import library, simulator, stages
from source_code.pipeline.comms import StageLink
from source_code.measure import clock
from source_code.pipeline.schedules import run_step


TOL = 1e-6  # max |gradient or loss - unsplit| in fp32 on the CPU (measured: <= 5e-7, notebook 10)


@dataclass(frozen=True)
class Workload:
    """What one pipeline step computes. ``microbatch`` is rows per microbatch: the batch is
    m x microbatch rows, so an operation costs the same whatever m is."""
    kind: str = "transformer"   # "transformer" (sort task) or "mlp" (equal stages, for timing)
    layers: int = 4
    dim: int = 64
    heads: int = 4
    microbatch: int = 4
    seed: int = 0

    def full_model(self) -> torch.nn.Module:
        torch.manual_seed(self.seed)
        if self.kind == "transformer":  # sort task: 32 tokens, vocabulary 16 + separator
            return models.TransformerLM(vocab_size=17, dim=self.dim, n_layers=self.layers,
                                        n_heads=self.heads, max_len=32)
        return stages.mlp_stack(self.dim, self.layers, self.seed)

    def stage(self, full, s: int, n: int) -> torch.nn.Module:
        cls = stages.TransformerStage if self.kind == "transformer" else stages.MLPStage
        return cls(full, s, n)

    def batch(self, m: int):
        """The whole batch (x, y) of m microbatches."""
        rows = m * self.microbatch
        if self.kind == "transformer":
            x, y = data.sequence_task("sort", n=max(rows, 64), seed=self.seed).tensors
            return x[:rows], y[:rows]                                       # (rows, 32) each
        g = torch.Generator().manual_seed(self.seed + 1)
        return torch.randn(rows, self.dim, generator=g), torch.randn(rows, self.dim, generator=g)

    def act_shape(self) -> tuple:
        return (self.microbatch, 32, self.dim) if self.kind == "transformer" else (self.microbatch, self.dim)

    def loss_fn(self, y_whole):
        if self.kind == "transformer":
            return functools.partial(stages.lm_loss, n_valid=int((y_whole != -100).sum()))
        return functools.partial(stages.mse_loss, n_total=y_whole.numel())


# --------------------------------------------------------------------------- own schedules
def own_step(work: Workload, schedule: str, m: int, stage, link, x, y, count_bytes=False,
             order=None, hold=None) -> dict:
    """One step of an own schedule on this rank (zero_grad first; gradients left in .grad)."""
    s, p = link.stage, link.n_stages
    order = order or simulator.stage_order(schedule, p, m, s)
    stage.zero_grad(set_to_none=False)  # keep the .grad buffers: no allocation inside a timed step
    dev = link.device
    return run_step(stage, order, link, work.act_shape(),
                    inputs=[_input(work, c.to(dev)) for c in x.chunk(m)] if s == 0 else None,
                    targets=[c.to(dev) for c in y.chunk(m)] if s == p - 1 else None,
                    loss_fn=work.loss_fn(y), count_bytes=count_bytes, hold=hold)


def _input(work: Workload, x):
    """The MLP stack's input asks for its gradient like every later stage's input does, so the
    first stage's backward does the same work as the others (the formula assumes equal stages)."""
    return x.clone().requires_grad_() if work.kind == "mlp" else x


def _reference(work: Workload, full, x, y, device):
    """The unsplit model's loss and gradients on the whole batch (by full-model name)."""
    full.zero_grad(set_to_none=True)
    kind = "transformer" if work.kind == "transformer" else "mlp"
    loss = stages.full_model_loss(full, x.to(device), y.to(device), kind)
    loss.backward()
    return float(loss.detach()), {n: q.grad for n, q in full.named_parameters()}


def _grad_diff(stage_modules, ref_grads) -> float:
    diffs = [(q.grad - ref_grads[name]).abs().max().item()
             for mod in stage_modules for name, q in zip(mod.source_names, mod.parameters())]
    return max(diffs)


def parity(schedule: str, m: int, work: Workload = Workload(), orders=None) -> dict:
    """One step of ``schedule`` (own: naive | gpipe | 1f1b, or a library name) vs the unsplit model.

    Returns this rank's max |gradient difference|, |loss difference| (ranks holding the last
    stage), the tolerance ``tol`` they must stay within on this device (``tol_why`` says it),
    and for own schedules the executed order and stored-activation counts. ``orders`` (one list
    per stage) replaces the schedule's own orders, e.g. a learner's 1F1B."""
    ctx = context()
    p, s = ctx.world_size, ctx.rank
    exact_math()  # a GPU: no TF32, deterministic cuDNN (the CPU ignores it)
    full = work.full_model().to(ctx.device)
    x, y = work.batch(m)
    out = {"rank": s, "schedule": schedule}
    out["tol"], out["tol_why"] = tolerance(ctx.device, TOL)
    if schedule in simulator.SCHEDULES:
        stage = work.stage(full, s, p)
        rep = own_step(work, schedule, m, stage, StageLink(s, p, ctx.device), x, y,
                       count_bytes=True, order=orders[s] if orders else None)
        mods, loss = [stage], (sum(rep["losses"]) if s == p - 1 else None)
        out.update(order=[(r["kind"], r["mb"]) for r in rep["records"]],
                   peak_in_flight=rep["peak_in_flight"], peak_bytes=rep["peak_bytes"])
    else:
        n = library.n_stages(schedule, p)
        mods = [work.stage(full, i, n).to(ctx.device) for i in library.stage_ids(schedule, s, p)]
        sched = library.build(schedule, dict(zip(library.stage_ids(schedule, s, p), mods)),
                              s, p, m, ctx.device, work.loss_fn(y))
        loss = library.step(sched, schedule, s, p, x.to(ctx.device), y.to(ctx.device))
    ref_loss, ref_grads = _reference(work, full, x, y, ctx.device)
    out["grad_diff"] = _grad_diff(mods, ref_grads)
    out["loss_diff"] = None if loss is None else abs(loss - ref_loss)
    out["loss"] = loss
    return out


# --------------------------------------------------------------------------- timing
def timed_steps(schedules, m: int, steps: int, work: Workload = Workload(), warmup: int = 1,
                hold=None) -> dict:
    """``warmup + steps`` steps of every schedule, interleaved step by step (a noisy neighbour
    slows all alike); SGD updates so that every step is a real training step. ``hold``: the
    fixed duration of every F and B of the own schedules (``schedules.run_step``), or None.

    Returns {schedule: {"step_s": [...], "records": [[...] per step] (own schedules)}} with
    step times measured on this rank between two barriers, the end once this rank's device
    has finished its step (``measure.clock``) and every rank has reached the barrier."""
    ctx = context()
    p, s = ctx.world_size, ctx.rank
    full = work.full_model().to(ctx.device)
    x, y = work.batch(m)
    runners = {}
    for name in schedules:
        if name in simulator.SCHEDULES:
            stage = work.stage(full, s, p)
            link = StageLink(s, p, ctx.device)
            opt = torch.optim.SGD(stage.parameters(), lr=1e-3)
            runners[name] = (functools.partial(own_step, work, name, m, stage, link, x, y, hold=hold), opt)
        else:
            ids = library.stage_ids(name, s, p)
            mods = [work.stage(full, i, library.n_stages(name, p)).to(ctx.device) for i in ids]
            sched = library.build(name, dict(zip(ids, mods)), s, p, m, ctx.device, work.loss_fn(y))
            opt = torch.optim.SGD([q for mod in mods for q in mod.parameters()], lr=1e-3)

            def lib_step(sched=sched, name=name, mods=mods):
                for mod in mods:
                    mod.zero_grad(set_to_none=True)
                library.step(sched, name, s, p, x.to(ctx.device), y.to(ctx.device))
                return None
            runners[name] = (lib_step, opt)
    out = {name: {"step_s": [], "records": []} for name in schedules}
    for it in range(warmup + steps):
        for name in schedules:
            run, opt = runners[name]
            dist.barrier()
            start = clock(ctx.device)
            rep = run()
            opt.step()
            clock(ctx.device)   # this rank's step is done on its device (a GPU runs behind the CPU)
            dist.barrier()      # and every rank's
            if it >= warmup:
                out[name]["step_s"].append(time.perf_counter() - start)
                if rep is not None:
                    out[name]["records"].append(rep["records"])
    return out


def gather_records(records: list[dict]) -> list[dict]:
    """Every stage's records of one step, on every rank, shifted so the step starts at 0."""
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, records)
    flat = [r for rs in everyone for r in rs]
    t0 = min(r["start"] for r in flat)
    return [{**r, "start": r["start"] - t0, "end": r["end"] - t0} for r in flat]


def all_parity(m: int = 4, work: Workload = Workload(), names=None) -> list[dict]:
    """``parity`` of every own and library schedule (naive with one microbatch); multi-stage
    library schedules need work.layers >= 2 x processes."""
    names = names or list(simulator.SCHEDULES) + library.available()
    return [parity(name, 1 if name == "naive" else m, work) for name in names]


if __name__ == "__main__":
    from source_code.processes import spawn
    per_rank = spawn(all_parity, 2)
    for rows in zip(*per_rank):
        worst_grad = max(r["grad_diff"] for r in rows)
        loss = max(r["loss_diff"] for r in rows if r["loss_diff"] is not None)
        print(f"{rows[0]['schedule']:<22} max |grad - unsplit| {worst_grad:.1e}   |loss - unsplit| {loss:.1e}")
