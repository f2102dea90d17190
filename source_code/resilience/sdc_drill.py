"""The corruption drill: data-parallel training, two checks after every step, a replay on a hit.

    python -m source_code.resilience.sdc_drill --world-size 3 --fault state-once --rank 1 --at-step 5

Every rank trains the same model on its slice of the batch (gradients averaged, so the replicas
stay bitwise equal). Faults (``--fault``, or several in one run from Python):
* ``state-once`` / ``state-repeat``: after the step, one low mantissa bit of one parameter of
  ``--rank`` flips (once, as a particle strike would; or every time that rank computes the step,
  as a failing memory cell would);
* ``compute-once`` / ``compute-repeat``: a high exponent bit of one gradient element flips on
  ``--rank`` before the all-reduce (once; or every time that device computes the step);
* ``compute-data``: the same, whichever device computes that rank's slice (the data, or a bug
  in the code, not a device);
* ``compute-small``: a low mantissa bit of one gradient element flips on ``--rank`` before the
  all-reduce, once: an error neither check is built to see.
After every step: the checksum check (sdc.py) and each rank's gradient norm check (rerun.py);
a hit is replayed from the state copy kept before the step and attributed. Then: a transient
fault's step is computed again (the fault does not come back); a faulty device's step is
computed without the fault (as after the device is taken out); a result that came back on
another device is right, and its step is skipped (its data set aside, as Megatron-LM lets a
job skip an iteration whose result reproduced). The cost of both checks (the local gradient
norm included) and of the state copy is timed per step, the faults' injection outside it.
"""
from __future__ import annotations

import copy
import time

import torch
import torch.distributed as dist

from source_code import processes, workload
from source_code.cli import Parser, nonnegative_int, positive_int
from source_code.errors import LaunchError, run_main
from source_code.resilience import common, rerun, sdc

KINDS = ("state-once", "state-repeat", "compute-once", "compute-repeat", "compute-data", "compute-small")
STATE_BIT = 3      # a low mantissa bit: the value moves by 2^-20 of its power of 2 (5e-7 to 1e-6
                   # of itself), the loss does not notice
GRAD_BIT = 30      # the exponent's top bit: a gradient element below 1 grows by 2^128


def _corrupt_gradient(model, bit: int) -> None:
    g = next(model.parameters()).grad.view(-1)
    index = int(((g.abs() > 0) & (g.abs() < 1)).nonzero()[0])     # stays finite once flipped
    sdc.flip_bit(g, index, bit)


def _rank_drill(steps: int, faults: list, batch_size: int = 24) -> dict:
    """``faults``: (kind, rank, step) each; rank 0's findings and timings come back."""
    rank, world = dist.get_rank(), dist.get_world_size()
    dataset = common.task()
    model, optimizer = common.build(0)
    fired, effect = set(), {}

    def backward(step: int, shift: int = 0) -> int:
        """Forward and backward of the slice of rank (rank - shift) % world; returns that slice."""
        part = (rank - shift) % world
        x, y = common.part_batch(dataset, step, batch_size, world, part)
        optimizer.zero_grad()
        workload.loss_fn(model, x, y).backward()
        return part

    def apply() -> None:
        for p in model.parameters():                       # data parallelism, written out
            dist.all_reduce(p.grad)
            p.grad /= world
        optimizer.step()

    def fault_in_gradient(step: int, part: int, clean: bool) -> None:      # the drill, not the lesson
        for kind, f_rank, f_step in faults:
            first = (kind, step) not in fired
            hit = {"compute-once": rank == f_rank and first, "compute-repeat": rank == f_rank,
                   "compute-data": part == f_rank, "compute-small": rank == f_rank and first}.get(kind, False)
            if step == f_step and hit and not clean:
                before = rerun.local_grad_norm(model)
                _corrupt_gradient(model, STATE_BIT if kind == "compute-small" else GRAD_BIT)
                effect.setdefault(kind, rerun.local_grad_norm(model) / before - 1)   # the norm's relative change
                fired.add((kind, step))

    def fault_in_state(step: int, clean: bool) -> None:
        for kind, f_rank, f_step in faults:
            first = (kind, step) not in fired
            if step == f_step and rank == f_rank and not clean and \
                    (kind == "state-repeat" or kind == "state-once" and first):
                sdc.flip_bit(next(model.parameters()), index=7, bit=STATE_BIT)     # the silent fault
                fired.add((kind, step))

    seen = [[] for _ in range(world)]
    found, cost = [], {"step": [], "copy": [], "checksum": [], "norm": []}
    for step in range(steps):
        t0 = time.perf_counter()
        before = {"model": copy.deepcopy(model.state_dict()), "optim": copy.deepcopy(optimizer.state_dict())}
        t1 = time.perf_counter()
        backward(step)
        t2 = time.perf_counter()
        fault_in_gradient(step, rank, clean=False)
        t3 = time.perf_counter()
        mine = rerun.local_grad_norm(model)                  # the gradient check, before the all-reduce
        t4 = time.perf_counter()
        apply()
        t5 = time.perf_counter()
        fault_in_state(step, clean=False)
        t6 = time.perf_counter()
        norms = common.gather_floats(mine)                   # world x 8 bytes
        flagged = [r for r in range(world) if rerun.is_unexpectedly_large(norms[r], seen[r])]
        t7 = time.perf_counter()
        odd = sdc.odd_ranks(model)                           # the checksum check: world x 8 bytes
        t8 = time.perf_counter()
        for key, dt in (("copy", t1 - t0), ("step", (t2 - t1) + (t5 - t4)), ("norm", (t4 - t3) + (t7 - t6)),
                        ("checksum", t8 - t7)):
            cost[key].append(dt)

        def replay(shift: int, update: bool = False, clean: bool = False) -> float:
            sdc.restore(model, optimizer, before)
            part = backward(step, shift)
            fault_in_gradient(step, part, clean)
            norm = rerun.local_grad_norm(model)
            if update:
                apply()
                fault_in_state(step, clean)
            return norm
        if odd:
            replay(0, update=True)
            verdict = sdc.state_verdict(odd, sdc.odd_ranks(model))
            found.append({"check": "checksum", "rank": odd[0], "step": step, "verdict": verdict,
                          "checksum_named": odd, "norm_flagged": flagged})
            if verdict != "transient":                       # computed again without the faulty unit
                replay(0, update=True, clean=True)
        elif flagged:
            verdict = rerun.attribute(replay, norms, flagged[0])
            found.append({"check": "gradient", "rank": flagged[0], "step": step, "verdict": verdict,
                          "checksum_named": odd, "norm_flagged": flagged})
            if verdict == "transient":
                replay(0, update=True)                       # again: the fault does not come back
            elif verdict == "persistent":
                replay(0, update=True, clean=True)           # without the faulty device
            else:
                sdc.restore(model, optimizer, before)        # a right result from bad data: skip the step
        if not flagged:
            for r in range(world):
                seen[r].append(norms[r])
    mid = {k: sorted(v)[len(v) // 2] for k, v in cost.items()}
    return {"found": found, "cost": mid, "checksum": sdc.checksum(model), "effect": effect}


def drill(faults=(("state-once", 1, 5),), steps: int = 8, world_size: int = 3, stream=None) -> dict:
    """Run the drill on ``world_size`` CPU processes; for each fault what was found at its step."""
    faults = [tuple(f) for f in faults]
    if world_size < 3:
        raise ValueError("naming the corrupted rank needs a majority: world_size >= 3")
    if any(k not in KINDS or not 0 <= r < world_size or not 0 <= s < steps for k, r, s in faults) \
            or len({s for _, _, s in faults}) < len(faults):
        raise ValueError(f"each fault: a kind of {KINDS}, a rank, a step below steps (one fault a step)")
    out = processes.spawn(_rank_drill, world_size, steps, faults, device="cpu", stream=stream)
    res = out[0]
    reports = []
    starts = sorted(s for _, _, s in faults)
    for kind, r, s in faults:
        # the first finding from the fault's step until the next fault's: found later, or not at all, shows
        end = next((t for t in starts if t > s), steps)
        found = sorted(res["found"], key=lambda f: f["step"])
        hit = next((f for f in found if s <= f["step"] < end), None) or \
            {"check": "none", "rank": -1, "step": -1, "verdict": "none", "checksum_named": [], "norm_flagged": []}
        reports.append({"fault": kind, "flip_rank": r, "flip_step": s, "detected_rank": hit["rank"],
                        "detected_step": hit["step"], "verdict": hit["verdict"], "check": hit["check"],
                        "checksum_named": hit["checksum_named"], "norm_flagged": hit["norm_flagged"]})
    effect = {k: v for r in out for k, v in r["effect"].items()}
    for report in reports:
        report["norm_change"] = effect.get(report["fault"])         # the fault's relative change of the norm
    return {"faults": reports, "findings": len(res["found"]), "cost": res["cost"],
            "agree_at_end": len({r["checksum"] for r in out}) == 1}


def main(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--world-size", type=positive_int, default=3)
    p.add_argument("--fault", choices=KINDS, default="state-once")
    p.add_argument("--rank", type=nonnegative_int, default=1, help="the rank (or slice) the fault strikes")
    p.add_argument("--at-step", type=nonnegative_int, default=5)
    p.add_argument("--steps", type=positive_int, default=8)
    a = p.parse_args(argv)
    if a.world_size < 3:
        raise LaunchError("error: --world-size must be >= 3: naming the odd rank needs a majority")
    if a.rank >= a.world_size or a.at_step >= a.steps:
        raise LaunchError("error: --rank must be below --world-size and --at-step below --steps")
    r = drill([(a.fault, a.rank, a.at_step)], a.steps, a.world_size)
    f, c = r["faults"][0], r["cost"]
    print(f"summary: fault={f['fault']} rank={f['flip_rank']} step={f['flip_step']} found_by={f['check']} "
          f"detected_rank={f['detected_rank']} detected_step={f['detected_step']} verdict={f['verdict']} "
          f"checksum_named={f['checksum_named']} agree_at_end={int(r['agree_at_end'])} "
          f"step_ms={1e3 * c['step']:.2f} copy_ms={1e3 * c['copy']:.2f} checksum_ms={1e3 * c['checksum']:.2f} "
          f"norm_ms={1e3 * c['norm']:.2f}")
    return 0


if __name__ == "__main__":
    run_main(main)
