"""Check function for notebook 09's ZeRO-3 core exercise (solution: source_code/solutions/nb09_own_fsdp.py).

    from source_code.sharding.own_fsdp_exercise import check_zero3_core, free_storage, gather
    check_zero3_core(unshard, after_forward)

The learner writes a unit's two forward hooks: ``unshard(unit)`` runs before the unit's
forward, ``after_forward(unit, out)`` after it, with the unit's output. ``unit`` has ``name``,
``full`` (the (N * c,) full buffer, 0 bytes between uses), ``shard`` and ``module``; the tools
are ``gather(unit)`` (all-gather every rank's shard into ``unit.full`` and make the module's
parameters views of it), ``free_storage(unit.full)`` and PyTorch's hooks.

The hooks run inside own_fsdp.Unit on N real processes (gloo), on a TransformerLM of the
check's own (width 20: every unit padded on 3 ranks) trained for two AdamW steps in fp64,
and the check watches each unit's full buffer from outside: whether it holds memory when the
unit's forward starts computing, once its forward is over, and when the unit's backward reads
what autograd saved from it (a saved-tensors hook). Where it is empty the check gathers it
itself, so the run goes on (reading a freed storage can crash the process) and every mistake
is seen; it also counts, in forward and when the backward reads a unit's parameters, how many
units hold memory at once; then the weights are compared with one process. One line says what is wrong, from
the first of: freed before computing, never freed, never gathered again, gathered again too
late, too many units full at once (more than a unit and one gathered ahead of it), wrong
weights. The check's saved-tensors hooks wrap any the learner's hooks open (a learner may
gather again when the backward unpacks what was saved). Sources are sent as text, as in own_fsdp_exercise.py.
"""
from __future__ import annotations

import argparse
import warnings

import torch
import torch.distributed as dist

from source_code import workload
from source_code.sharding.own_fsdp import Unit, free_storage, full_state_dict, shard_by_hand  # noqa: F401 (free_storage: the learner's tool)
from source_code.sharding.parity import train

CFG = workload.model_config(dim=20, n_layers=2)
STEPS, BATCH = 2, 12


class UnitView:
    """What the learner's hooks see of a unit."""

    def __init__(self, unit: Unit):
        self.name, self.full, self.shard, self.module = unit.name, unit.full, unit.shard, unit.module
        self._unit = unit


LOG: list = []             # (what, unit name, phase, step): the learner's gathers, the check's findings
PHASE = {"now": "forward", "step": 0}


def gather(unit: UnitView) -> None:
    """All-gather every rank's shard into ``unit.full`` and make the parameters views of it."""
    LOG.append(("gather", unit.name, PHASE["now"], PHASE["step"]))
    Unit.unshard(unit._unit)


def empty(unit: Unit) -> bool:
    return unit.full.untyped_storage().nbytes() == 0


class LearnerUnit(Unit):
    """own_fsdp.Unit whose forward hooks are the learner's; everything else is the lesson's."""

    hooks_of_learner = (None, None)

    def unshard(self) -> None:
        self.hooks_of_learner[0](self.view)

    def after_forward(self, out):
        got = self.hooks_of_learner[1](self.view, out)
        return out if got is None else got


UNITS: list = []           # the run's units, to count how many are full at once
CROWD = 2                  # a unit and one gathered ahead of it (prefetching) may be full together


def others_full(unit: Unit) -> list[str]:
    return [u.name for u in UNITS if u is not unit and not empty(u)]


def top_saved_hooks():
    """The saved-tensors hooks active now (the learner's, if any), or None."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    return top(True) if top is not None else None


def watch(unit: Unit) -> None:
    """The check's own hooks around ``unit``: they run after the learner's forward hooks. Its
    saved-tensors hooks wrap any the learner opened, so a learner's own unpack runs first."""
    saved = {}

    def crowded(phase_unit: Unit) -> None:
        if len(others_full(phase_unit)) + 1 > CROWD:
            LOG.append(("crowded", phase_unit.name, PHASE["now"], PHASE["step"]))

    def before(module, args):
        if empty(unit):
            LOG.append(("empty_at_forward", unit.name, PHASE["now"], PHASE["step"]))
            Unit.unshard(unit)
        crowded(unit)
        outer = top_saved_hooks()
        outer_pack, outer_unpack = outer if outer is not None else (None, None)

        def pack(t):
            owner = unit if t._base is unit.full else None
            return (outer_pack(t) if outer_pack else t), owner

        def unpack(packed):
            inner, owner = packed
            t = outer_unpack(inner) if outer_unpack else inner   # the learner's unpack, if any
            if owner is not None:
                if empty(owner):                    # backward reads a freed buffer: refill it
                    LOG.append(("empty_at_backward", owner.name, PHASE["now"], PHASE["step"]))
                    Unit.gather(owner)
                crowded(owner)
            return t

        saved["ctx"] = torch.autograd.graph.saved_tensors_hooks(pack, unpack)
        saved["ctx"].__enter__()

    def after(module, args, out):
        saved.pop("ctx").__exit__(None, None, None)
        if not empty(unit):
            LOG.append(("kept_after_forward", unit.name, PHASE["now"], PHASE["step"]))

    unit.module.register_forward_pre_hook(before)
    unit.module.register_forward_hook(after)


def reference(dataset, world: int) -> dict:
    """One process, fp64, the same global batches in N slices."""
    model = workload.build_model(CFG, 0).double()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    args = argparse.Namespace(steps=STEPS, batch_size=BATCH, seed=0)
    train(model, opt, dataset, args, 0, 1, "cpu", split=world)
    return {n: p.detach() for n, p in model.named_parameters()}


def diagnose(log: list, diff: float) -> str | None:
    """The first mistake the run showed, one line (None: right)."""
    learner_gathers = {(n, ph, st) for what, n, ph, st in log if what == "gather"}
    for what, name, phase, step in log:
        if what == "empty_at_forward":
            if (name, "forward", step) in learner_gathers:
                return (f"unit {name}'s forward started computing with its full buffer freed: you "
                        "gathered it, then freed it before the unit used it; free it after its forward")
            return (f"unit {name}'s forward started computing with nothing gathered: its "
                    "parameters exist only once every rank's shard has been gathered")
    for what, name, *_ in log:
        if what == "kept_after_forward":
            return (f"unit {name} still holds its full parameters after its forward: ZeRO-3 frees "
                    "them until the backward needs them, or every unit is whole at once")
    for what, name, _, step in log:
        if what == "empty_at_backward" and (name, "backward", step) in learner_gathers:
            return (f"unit {name} was gathered again in backward only after its backward had read "
                    "its parameters: gather when the backward reaches the unit, before it computes")
    for what, name, _, step in log:
        if what == "empty_at_backward":
            later = " (your hook gathered it only in a later step: one registered during a module's " \
                    "call can take effect from its next call)" if any(
                        n == name and ph == "backward" for n, ph, _ in learner_gathers) else ""
            return (f"unit {name}'s backward in step {step + 1} read its parameters from the freed "
                    f"buffer and nothing gathered them again: what autograd saved points at that "
                    f"storage{later}")
    for what, name, phase, _ in log:
        if what == "crowded":
            return (f"while unit {name}'s {phase} computed, more than {CROWD} units held their full "
                    f"parameters: gather a unit when the {phase} reaches it, not all of them at once")
    if diff > 1e-10:
        return f"the buffer's life is right but the weights differ from one process by {diff:.3g}"
    return None


def run_one(pair, dataset, ref: dict) -> str | None:
    """Train the check's model with the learner's hooks ((source, name) of each) on this rank;
    the diagnosis."""
    namespace = {"torch": torch, "dist": dist, "gather": gather, "free_storage": free_storage}
    try:
        for source, name in pair:
            exec(compile(source, f"<{name}>", "exec"), namespace)
        fns = tuple(namespace[name] for _, name in pair)
    except Exception as err:
        return f"your code did not run: {type(err).__name__}: {err}"
    LOG.clear()
    model = workload.build_model(CFG, 0).double()
    LearnerUnit.hooks_of_learner = fns
    units = shard_by_hand(model, unit_class=LearnerUnit)
    UNITS[:] = units
    for u in units:
        u.view = UnitView(u)
        watch(u)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")           # hooks of the learner's choice may warn
            for step in range(STEPS):
                x, y = workload.rank_slice(workload.global_batch(dataset, step, BATCH, 0), rank, world)
                PHASE["now"], PHASE["step"] = "forward", step
                loss = workload.loss_fn(model, x, y)
                PHASE["now"] = "backward"
                loss.backward()
                opt.step()
                opt.zero_grad()
    except Exception as err:
        text = str(err).strip().splitlines()[0] if str(err).strip() else ""
        return f"your hooks raised {type(err).__name__}: {text[:160]}"
    got = full_state_dict(model)
    diff = max((got[n] - ref[n]).abs().max().item() for n in ref)
    return diagnose(list(LOG), diff)


def core_on_rank(pairs: list) -> list[str | None]:
    """On every rank: each ((source, name) of unshard, (source, name) of after_forward); the
    first problem of each, or None."""
    if not pairs:
        return []
    dataset = workload.sort_task(n=64)
    ref = reference(dataset, dist.get_world_size())
    out = []
    for pair in pairs:
        problem = run_one(pair, dataset, ref)
        found = [None] * dist.get_world_size()
        dist.all_gather_object(found, problem)
        out.append(next((p for p in found if p), None))
    return out
