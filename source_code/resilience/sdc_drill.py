"""The bit-flip drill: data-parallel training, a checksum check after every step, a replay on a hit.

    python -m source_code.resilience.sdc_drill --world-size 3 --flip-rank 1 --at-step 5 --fault flip

Every rank trains the same model on its slice of the batch (gradients averaged, so the
replicas stay bitwise equal); after step ``--at-step`` one bit of one parameter on
``--flip-rank`` is flipped (``--fault flip``: once, as a particle strike would; ``--fault
repeat``: every time that step is computed, as a wrong kernel would). The check after each step
names the rank; the replay tells the two apart. The check's cost is timed per step.
"""
from __future__ import annotations

import copy
import time

import torch
import torch.distributed as dist

from source_code import processes, workload
from source_code.cli import Parser, nonnegative_int, positive_int
from source_code.errors import LaunchError, run_main
from source_code.resilience import common, sdc

BIT = 3   # a low mantissa bit: the value moves by ~1e-7 of itself, the loss does not notice


def _rank_drill(steps: int, faults: list, batch_size: int = 24) -> dict:
    """``faults``: (rank, step, kind) each. Every finding is replayed, then the step is computed
    again without its fault (the suspect unit drained), so that the next fault starts clean."""
    rank, world = dist.get_rank(), dist.get_world_size()
    dataset = common.task()
    model, optimizer = common.build(0)
    good = {"model": copy.deepcopy(model.state_dict()), "optim": copy.deepcopy(optimizer.state_dict())}
    found, check_s, step_s = [], [], []

    def one_step(step: int, replay: bool = False, inject: bool = True) -> float:
        x, y = common.part_batch(dataset, step, batch_size, world, rank)
        optimizer.zero_grad()
        loss = workload.loss_fn(model, x, y)
        loss.backward()
        for p in model.parameters():                       # data parallelism, written out
            dist.all_reduce(p.grad)
            p.grad /= world
        optimizer.step()
        for f_rank, f_step, kind in faults:
            if inject and step == f_step and rank == f_rank and (kind == "repeat" or not replay):
                sdc.flip_bit(next(model.parameters()), index=7, bit=BIT)     # the silent fault
        return loss.item()

    for step in range(steps):
        t0 = time.perf_counter()
        one_step(step)
        t1 = time.perf_counter()
        odd = sdc.odd_ranks(model)                           # the check, after every step
        t2 = time.perf_counter()
        step_s.append(t1 - t0)
        check_s.append(t2 - t1)
        if odd:
            verdict = sdc.replay_verdict(model, optimizer, good, lambda replay: one_step(step, replay))
            found.append({"rank": odd[0], "step": step, "verdict": verdict})
            if verdict == "repeats":                         # go on without the faulty unit
                model.load_state_dict(good["model"])
                optimizer.load_state_dict(good["optim"])
                one_step(step, replay=True, inject=False)
        good = {"model": copy.deepcopy(model.state_dict()), "optim": copy.deepcopy(optimizer.state_dict())}
    mid = lambda v: sorted(v)[len(v) // 2]
    return {"found": found, "check_seconds": mid(check_s), "step_seconds": mid(step_s),
            "checksum": sdc.checksum(model)}


def drill(flip_rank: int = 1, at_step: int = 5, steps: int = 8, world_size: int = 3,
          fault: str = "flip", more: tuple = (), stream=None) -> dict:
    """Run the drill on ``world_size`` CPU processes; what rank 0 found, with the check's cost.

    ``more``: further (rank, step, kind) faults in the same run; ``faults`` lists every fault
    with what was found for it, the top-level fields are the first fault's."""
    if world_size < 3:
        raise ValueError("naming the corrupted rank needs a majority: world_size >= 3")
    faults = [(flip_rank, at_step, fault), *more]
    if any(not 0 <= r < world_size or not 0 <= s < steps or k not in ("flip", "repeat") for r, s, k in faults) \
            or len({s for _, s, _ in faults}) < len(faults):
        raise ValueError("each fault: a rank, a step below steps (one fault a step), kind 'flip' or 'repeat'")
    out = processes.spawn(_rank_drill, world_size, steps, faults, device="cpu", stream=stream)
    res = out[0]
    reports = []
    for r, s, kind in faults:
        hit = next((f for f in res["found"] if f["step"] == s), {"rank": -1, "step": -1, "verdict": "none"})
        reports.append({"detected_rank": hit["rank"], "detected_step": hit["step"], "verdict": hit["verdict"],
                        "flip_rank": r, "flip_step": s, "fault": kind, "check_seconds": res["check_seconds"],
                        "step_seconds": res["step_seconds"]})
    return {**reports[0], "faults": reports, "findings": len(res["found"]),
            "agree_at_end": len({r["checksum"] for r in out}) == 1}


def main(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--world-size", type=positive_int, default=3)
    p.add_argument("--flip-rank", type=nonnegative_int, default=1)
    p.add_argument("--at-step", type=nonnegative_int, default=5)
    p.add_argument("--steps", type=positive_int, default=8)
    p.add_argument("--fault", choices=("flip", "repeat"), default="flip")
    a = p.parse_args(argv)
    if a.world_size < 3:
        raise LaunchError("error: --world-size must be >= 3: naming the odd rank needs a majority")
    if a.flip_rank >= a.world_size or a.at_step >= a.steps:
        raise LaunchError("error: --flip-rank must be below --world-size and --at-step below --steps")
    r = drill(a.flip_rank, a.at_step, a.steps, a.world_size, a.fault)
    print(f"summary: flipped rank={r['flip_rank']} step={r['flip_step']} sdc_detected_rank="
          f"{r['detected_rank']} detected_step={r['detected_step']} replay={r['verdict']} "
          f"check_ms={1e3 * r['check_seconds']:.2f} step_ms={1e3 * r['step_seconds']:.2f}")
    return 0


if __name__ == "__main__":
    run_main(main)
