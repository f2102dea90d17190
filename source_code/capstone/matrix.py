"""Every configuration of the capstone in ONE set of 4 processes, against one process.

    python -m source_code.capstone.matrix                 # 4 CPU processes, 3 steps, the table
    python -m source_code.capstone.matrix --steps 5 --batch-size 16

The processes start once (torch's import costs seconds a process); inside them every
configuration loads the same seed checkpoint (seed.py), reads the same global batches (uneven
valid tokens in every sample) in the same order and trains ``--steps`` SGD steps; rank 0
compares its loss curve and its final weights (gathered: full tensors) with the one-process
run of the whole batch. The uneven-token gradients of normalisation.py run in the same
processes first. Rank 0 prints a line per configuration as it finishes; the last line:

    summary: configs=N max_loss_diff=D uneven_tokens_grad_diff_fixed=F uneven_tokens_grad_diff_naive=G
"""
from __future__ import annotations

import os
import tempfile
import time

import torch
import torch.distributed as dist

from source_code import torch_versions
from source_code.capstone import normalisation, runners_combo, runners_dp, runners_model, seed
from source_code.cli import Parser, positive_float, positive_int
from source_code.errors import LaunchError, run_main
from source_code.mesh.parity import quiet_redistribute_warnings

WORLD = 4
GROUPS = {"data parallel": runners_dp, "model parallel": runners_model, "combinations": runners_combo}
NAMES = tuple(n for module in GROUPS.values() for n in module.NAMES)
FULLY_SHARD = ("FSDP2", "FSDP x TP")   # the configurations built on torch's fully_shard


def family(name: str) -> str:
    return next(k for k, module in GROUPS.items() if name in module.NAMES)


def check(steps: int, batch_size: int, names=NAMES) -> None:
    """Refuse what the configurations cannot run, in one line, before any process starts."""
    unknown = [n for n in names if n not in NAMES]
    if unknown:
        raise LaunchError(f"error: unknown configuration {unknown[0]!r}; choose from {', '.join(NAMES)}")
    sharded = [n for n in names if n in FULLY_SHARD]
    if sharded and not torch_versions.supported("fsdp2", "cpu"):   # the processes run on the CPU
        others = " ".join(repr(n) for n in names if n not in FULLY_SHARD)
        raise LaunchError(f"{torch_versions.refusal('fsdp2')}; {', '.join(sharded)} use(s) it "
                          f"(the others run here: --configs {others})")
    need = 2 * runners_model.MICROBATCHES          # PP x DP: 2 pipelines x 4 microbatches
    if batch_size % need:
        raise LaunchError(f"error: --batch-size {batch_size} must be a multiple of {need} "
                          f"(2 data-parallel pipelines x {runners_model.MICROBATCHES} microbatches)")


def _max_diff(got: dict, want: dict) -> float:
    return max(((got[n] - want[n]).abs().max().item() for n in got), default=0.0)


KEPT = ("one process, 4 pieces", "DDP, sum in rank order")


def measure(runner, data, refs: dict, keep: bool = False) -> dict:
    """Train ``runner`` on ``data`` (every rank); its loss curve and its largest differences
    from the one-process reference of its kind (``refs[kind]`` = (losses, weights))."""
    losses = [runner.step(x, y, seed.n_valid(y)) for x, y in data]
    weights = runner.weights()
    ref_losses, ref_weights = refs[runner.kind]
    diff = torch.tensor([_max_diff(weights, ref_weights)])
    dist.all_reduce(diff, op=dist.ReduceOp.MAX)
    curves = [None] * dist.get_world_size()
    dist.all_gather_object(curves, losses if losses[0] is not None else None)
    curve = next(c for c in curves if c is not None)
    return {"kind": runner.kind, "losses": curve, "param_diff": diff.item(),
            "loss_diff": max(abs(a - b) for a, b in zip(curve, ref_losses)),
            "weights": weights if keep else None}


def references(path, data, lr: float, pieces: int = 0) -> dict:
    """kind -> (losses, weights) of one process, computed on rank 0 and sent to every rank."""
    refs = [None]
    if dist.get_rank() == 0:
        refs = [{kind: seed.reference(path, data, kind, lr) for kind in ("dense", "moe")}]
        if pieces:
            refs[0]["pieces"] = seed.reference(path, data, "dense", lr, pieces=pieces)
    dist.broadcast_object_list(refs)
    return refs[0]


def run_all(path, steps: int, batch_size: int, lr: float, names=NAMES, with_bug: bool = False,
            choice: dict | None = None) -> dict | None:
    """On every rank of a 4-process group: the uneven-token case, then every configuration.
    Rank 0 returns {"uneven", "reference": {kind: losses}, "rows": [...], "order_fixed"}."""
    quiet_redistribute_warnings()
    rank = dist.get_rank()
    uneven = normalisation.uneven_case(path)
    data = seed.batches(steps, batch_size)
    refs = references(path, data, lr, pieces=WORLD)
    rows, kept = [], {}
    for name in names:
        start = time.perf_counter()
        row = measure(GROUPS[family(name)].build(name, path, lr), data, refs, keep=name in KEPT)
        row.update(name=name, family=family(name), seconds=time.perf_counter() - start)
        if name in KEPT and rank == 0:
            kept[name] = (row["losses"], row.pop("weights"))
        row.pop("weights", None)
        rows.append(row)
        if rank == 0:
            print(f"{name:<24} loss diff {row['loss_diff']:.1e}  weight diff {row['param_diff']:.1e}"
                  f"  ({row['seconds']:.1f} s)", flush=True)
    if with_bug:
        from source_code.capstone.exercises import sync_dp_only
        bug = measure(runners_combo.dp_cp(path, lr, sync=sync_dp_only), data, refs)
        bug.pop("weights", None)
        if rank == 0:
            print(f"{'DP x CP, seeded bug':<24} loss diff {bug['loss_diff']:.1e}  weight diff "
                  f"{bug['param_diff']:.1e}", flush=True)
    if choice:
        from source_code.capstone.choose import build
        mine = measure(build(path, lr, WORLD, **choice), data, refs)
        mine.pop("weights", None)
    dist.barrier()
    if rank != 0:
        return None
    out = {"uneven": uneven, "reference": {k: v[0] for k, v in refs.items()}, "rows": rows}
    if with_bug:
        out["seeded_bug"] = bug
    if choice:
        out["choice"] = mine
    if len(kept) == 2:
        (c1, w1), (c2, w2) = kept.values()
        out["order_fixed"] = {"loss_diff": max(abs(a - b) for a, b in zip(c1, c2)),
                              "param_diff": _max_diff(w2, w1)}
    return out


def run(steps: int = 3, batch_size: int = 8, lr: float = seed.LR, names=NAMES, directory=None,
        with_bug: bool = False, choice: dict | None = None) -> dict:
    """Save the seed checkpoint, start 4 CPU processes once, run everything; rank 0's result
    (``with_bug``: also the DP x CP run with the seeded bug of the exercise, "seeded_bug";
    ``choice``: sizes for choose.plan on these 4 processes, checked first, "choice")."""
    from source_code.processes import spawn
    check(steps, batch_size, names)
    if choice:
        from source_code.capstone.choose import SIZES, plan
        choice = {**{k: 1 for k in SIZES}, "zero": 0, **choice}
        plan(WORLD, batch_size=batch_size, **choice)
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        path = seed.save_seed(os.path.join(tmp, "seed.pt"))
        return spawn(run_all, WORLD, path, steps, batch_size, lr, tuple(names), with_bug,
                     choice, device="cpu")[0]


def summary(result: dict) -> dict:
    """The numbers of the summary line from a ``run`` result."""
    u = result["uneven"]
    cases = ("ddp", "accumulation", "pipeline")
    return {"configs": len(result["rows"]),
            "max_loss_diff": max(r["loss_diff"] for r in result["rows"]),
            "max_param_diff": max(r["param_diff"] for r in result["rows"]),
            "uneven_tokens_grad_diff_fixed": max(u[c]["fixed"] for c in cases),
            "uneven_tokens_grad_diff_naive": min(u[c]["naive"] for c in cases)}


def summary_line(s: dict) -> str:
    return (f"summary: configs={s['configs']} max_loss_diff={s['max_loss_diff']:.3g} "
            f"uneven_tokens_grad_diff_fixed={s['uneven_tokens_grad_diff_fixed']:.3g} "
            f"uneven_tokens_grad_diff_naive={s['uneven_tokens_grad_diff_naive']:.3g}")


def main(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=positive_int, default=3)
    p.add_argument("--batch-size", type=positive_int, default=8, help="global batch (a multiple of 8)")
    p.add_argument("--lr", type=positive_float, default=seed.LR)
    p.add_argument("--configs", nargs="+", default=list(NAMES), metavar="NAME",
                   help="a subset of the configurations (quoted names)")
    args = p.parse_args(argv)
    check(args.steps, args.batch_size, args.configs)
    result = run(args.steps, args.batch_size, args.lr, args.configs)
    s = summary(result)
    print(f"uneven tokens, max |grad - one process|: naive {s['uneven_tokens_grad_diff_naive']:.3g}, "
          f"fixed {s['uneven_tokens_grad_diff_fixed']:.3g}; weights after {args.steps} steps: "
          f"max |diff| {s['max_param_diff']:.3g}")
    print(summary_line(s))
    return 0


if __name__ == "__main__":
    run_main(main)
