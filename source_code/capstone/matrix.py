"""Every configuration of the capstone against one process, in fp32 and in fp64.

    python -m source_code.capstone.matrix                   # 2, 4 and 8 CPU processes, the table
    python -m source_code.capstone.matrix --steps 5 --steps-fp64 20 --batch-size 16
    python -m source_code.capstone.matrix --configs DDP "PP x DP x TP"

The processes start three times, once per world size (2 for one model-parallel kind and the
uneven-token cases, 4 for data parallelism and the pairs, 8 for the three-kind meshes), and run
every configuration of that size inside them. Each configuration loads the same seed checkpoint (seed.py),
reads the same global batches (uneven valid tokens in every sample) in the same order, and
trains ``--steps`` SGD steps in fp32, then ``--steps-fp64`` in fp64 from the same seed;
rank 0 compares its loss curve and its final weights (gathered: full tensors) with one
process on the whole batch in the same dtype. In fp32 the arithmetic of a split differs from
the unsplit one by a few units in the last place (~1e-7 of a loss of 3.5); in fp64 by ~1e-16,
so a bug that moves a loss by one fp32 unit per step stands out by 8 orders of magnitude.
The two controls (one process on 4 pieces, DDP with rank-ordered sums) run in fp32 only.
The uneven-token cases of normalisation.py run first, with DDP trained naive and fixed on the
fp64 batches (result["curves"]). Rank 0 prints a line per configuration;
the last line:

    summary: parallel_configs=P controls=C three_d_configs=T max_loss_diff=D max_param_diff=W
             steps=S max_loss_diff_fp64=D64 max_param_diff_fp64=W64 steps_fp64=S64
             uneven_tokens_grad_diff_fixed=F uneven_tokens_grad_diff_naive=G
"""
from __future__ import annotations

import os
import tempfile
import time

import torch
import torch.distributed as dist

from source_code import torch_versions
from source_code.capstone import (compare, normalisation, runners_3d, runners_combo, runners_dp,
                                  runners_model, runners_pipeline, seed)
from source_code.capstone.runner import Spec
from source_code.cli import Parser, positive_float, positive_int
from source_code.errors import LaunchError, run_main
from source_code.mesh.parity import quiet_redistribute_warnings

WORLD = 4                       # the data-parallel family and the pairs (2 x 2)
FAMILIES = {"data parallel": runners_dp.ROWS,                                   # 4 processes
            "one model-parallel kind": {**runners_model.ROWS, **runners_pipeline.ROWS},   # 2
            "two kinds (2 x 2)": runners_combo.ROWS,                             # 4
            "three kinds (2 x 2 x 2)": runners_3d.ROWS}                          # 8
WORLDS = {"data parallel": WORLD, "one model-parallel kind": 2, "two kinds (2 x 2)": WORLD,
          "three kinds (2 x 2 x 2)": runners_3d.WORLD}
BUILD = {name: build for rows in FAMILIES.values() for name, build in rows.items()}
NAMES = tuple(BUILD)
CONTROLS = runners_dp.CONTROLS
THREE_D = tuple(runners_3d.ROWS)
NEEDS = {"FSDP2": "fsdp2", "FSDP x TP": "fsdp2", "PP GPipe (torch)": "gpipe",
         "PP 1F1B (torch)": "pipelining", "PP x DP x TP": "gpipe"}   # torch_versions features
DTYPES = {"fp32": torch.float32, "fp64": torch.float64}
LOSS_TOL, WEIGHT_TOL, TOL_FP64 = 1e-5, 1e-6, 1e-12    # the bounds against one process


def family(name: str) -> str:
    if name in CONTROLS:
        return "control"
    return next(k for k, rows in FAMILIES.items() if name in rows)


def world_of(name: str) -> int:
    """Processes of a configuration: every model-parallel kind at degree 2, data parallelism
    on 4 (its rank-order control needs more than 2 ranks to add in another order)."""
    return next(WORLDS[k] for k, rows in FAMILIES.items() if name in rows)


def check(batch_size: int, names=NAMES) -> None:
    """Refuse what the configurations cannot run, in one line, before any process starts."""
    unknown = [n for n in names if n not in NAMES]
    if unknown:
        raise LaunchError(f"error: unknown configuration {unknown[0]!r}; choose from "
                          f"{', '.join(repr(n) for n in NAMES)}")
    missing = [n for n in names if n in NEEDS and not torch_versions.supported(NEEDS[n], "cpu")]
    if missing:                                     # the processes run on the CPU with gloo
        others = " ".join(repr(n) for n in names if n not in missing)
        raise LaunchError(f"{torch_versions.refusal(NEEDS[missing[0]])}; {', '.join(missing)} "
                          f"need(s) it (the others run here: --configs {others})")
    need = 2 * runners_pipeline.MICROBATCHES       # PP x DP: 2 pipelines x 4 microbatches
    if batch_size % need:
        raise LaunchError(f"error: --batch-size {batch_size} must be a multiple of {need} "
                          f"(2 data-parallel pipelines x {runners_pipeline.MICROBATCHES} microbatches)")


def run_rows(path, names, steps: dict, batch_size: int, lr: float, kinds=("dense",),
             extra=None) -> dict | None:
    """On every rank: each configuration of ``names`` in every dtype of ``steps`` (controls in
    fp32 only) against the one-process references of ``kinds``; rank 0 prints a line per
    configuration and returns the rows. ``extra(path, data, refs)`` -> more results."""
    quiet_redistribute_warnings()
    data = {k: seed.batches(n, batch_size) for k, n in steps.items()}
    refs = {k: compare.references(path, data[k], lr, DTYPES[k], kinds) for k in steps}
    rows = []
    for name in names:
        start, row = time.perf_counter(), {"name": name, "family": family(name), "world": world_of(name)}
        for k in steps:
            if k == "fp64" and name in CONTROLS:
                continue
            got = compare.measure(BUILD[name](Spec(path, lr, DTYPES[k])), data[k], refs[k],
                                  keep=name in CONTROLS)
            weights = got.pop("weights")
            if name in CONTROLS and dist.get_rank() == 0:
                row["weights"] = weights
            row[k] = got
        row["seconds"] = time.perf_counter() - start
        if dist.get_rank() == 0:
            print(row_line(row, steps), flush=True)
        rows.append(row)
    more = extra(path, data, refs) if extra else {}
    dist.barrier()
    if dist.get_rank() != 0:
        return None
    controls = [r for r in rows if r["name"] in CONTROLS]
    if len(controls) == 2:   # the same sums in the same order: compared bit for bit
        (a, b) = controls
        compare.check_names([b["weights"]], a["weights"])
        pairs = zip(a["fp32"]["losses"], b["fp32"]["losses"], strict=True)
        more["order_fixed"] = {"loss_diff": max(abs(u - v) for u, v in pairs),
                               "param_diff": compare.max_diff(b["weights"], a["weights"])}
    for r in controls:
        r.pop("weights")     # tensors stay in the process
    return {"rows": rows, "reference": {k: {kind: v[0] for kind, v in refs[k].items()} for k in steps},
            **more}


def row_line(row: dict, steps: dict) -> str:
    parts = [f"{k} loss diff {row[k]['loss_diff']:.1e} weight diff {row[k]['param_diff']:.1e}"
             for k in steps if k in row]
    return f"{row['name']:<24} " + " | ".join(parts) + f"  ({row['seconds']:.1f} s)"


def run_world(path, names, steps, batch_size, lr, uneven=False, with_bug=False, choice=None):
    """One set of processes: the uneven-token cases (``uneven``), the configurations, the
    exercise's handed step (``with_bug``) and the chosen configuration (``choice``)."""
    cases = normalisation.uneven_cases(path) if uneven else None

    def extra(path, data, refs):
        out = {}
        if uneven:      # the uneven tokens over training: DDP on the fp64 batches, naive and fixed
            ref = refs["fp64"]["dense"][0]
            out["curves"] = {"one process": ref, **{key: normalisation.ddp_curve(
                path, data["fp64"], lr, DTYPES["fp64"], key == "fixed") for key in ("naive", "fixed")}}
        if with_bug:
            from source_code.capstone import exercises
            bug = compare.measure(exercises.step_runner(Spec(path, lr), exercises.handed_step),
                                  data["fp32"], refs["fp32"])
            bug.pop("weights")
            bug["report"] = exercises.one_step_diffs(path, exercises.handed_step, (exercises.REPORT_MESH,))[0]
            out["seeded_bug"] = bug
        if choice:
            from source_code.capstone.choose import build
            got = compare.measure(build(Spec(path, lr), WORLD, **choice), data["fp32"], refs["fp32"])
            got.pop("weights")
            out["choice"] = got
        return out
    result = run_rows(path, names, steps, batch_size, lr, ("dense", "moe"), extra)
    return result and {**result, **({"uneven": cases} if uneven else {})}


def run(steps: int = 3, steps_fp64: int = 10, batch_size: int = 8, lr: float = seed.LR,
        names=NAMES, directory=None, with_bug: bool = False, choice: dict | None = None) -> dict:
    """Save the seed checkpoint, start the processes (2 for one model-parallel kind and the
    uneven-token cases, 4 for data parallelism and the pairs, 8 for the three-kind meshes),
    run everything; rank 0's results merged (``with_bug``: also the exercise's handed DP x CP
    step, "seeded_bug"; ``choice``: sizes for choose.plan on 4 processes, checked first)."""
    from source_code.processes import spawn
    check(batch_size, names)
    if choice:
        from source_code.capstone.choose import SIZES, plan
        choice = {**{k: 1 for k in SIZES}, "zero": 0, **choice}
        plan(WORLD, batch_size=batch_size, **choice)
    counts = {"fp32": steps, "fp64": steps_fp64}
    by_world = {w: [n for n in names if world_of(n) == w] for w in sorted(set(WORLDS.values()))}
    result = {"rows": [], "reference": None}
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        path = seed.save_seed(os.path.join(tmp, "seed.pt"))
        for world, mine in by_world.items():
            first, here = world == 2, world == WORLD
            if not (mine or first or (here and (with_bug or choice))):
                continue
            got = spawn(run_world, world, path, mine, counts, batch_size, lr, first,
                        with_bug and here, choice if here else None, device="cpu")[0]
            rows = result["rows"] + got.pop("rows")
            result.update({k: v for k, v in got.items() if k != "reference" or result["reference"] is None})
            result["rows"] = rows
    order = {n: i for i, n in enumerate(NAMES)}
    result["rows"].sort(key=lambda r: order[r["name"]])
    result["steps"] = counts
    return result


def within(row: dict) -> bool:
    """Did the configuration meet the bounds: fp32 loss <= 1e-5 and weights <= 1e-6, fp64 both
    <= 1e-12?"""
    fp32, fp64 = row["fp32"], row.get("fp64", {"loss_diff": 0.0, "param_diff": 0.0})
    return (fp32["loss_diff"] <= LOSS_TOL and fp32["param_diff"] <= WEIGHT_TOL
            and max(fp64["loss_diff"], fp64["param_diff"]) <= TOL_FP64)


def summary(result: dict) -> dict:
    """The numbers of the summary line from a ``run`` result: configurations counted when they
    met the bounds (``within``), steps counted on the loss curves the runs returned."""
    u, rows = result["uneven"], result["rows"]
    cases = [c for c in normalisation.cases() if c in u]
    fp64 = [r["fp64"] for r in rows if "fp64" in r]
    return {"parallel_configs": sum(r["family"] != "control" and within(r) for r in rows),
            "controls": sum(r["family"] == "control" for r in rows),
            "three_d_configs": sum(r["name"] in THREE_D and within(r) for r in rows),
            "max_loss_diff": max(r["fp32"]["loss_diff"] for r in rows),
            "max_param_diff": max(r["fp32"]["param_diff"] for r in rows),
            "steps": min(len(r["fp32"]["losses"]) for r in rows),
            "max_loss_diff_fp64": max((r["loss_diff"] for r in fp64), default=float("nan")),
            "max_param_diff_fp64": max((r["param_diff"] for r in fp64), default=float("nan")),
            "steps_fp64": min((len(r["losses"]) for r in fp64), default=0),
            "uneven_cases": cases,
            "uneven_tokens_grad_diff_fixed": max(u[c]["fixed"] for c in cases),
            "uneven_tokens_grad_diff_naive": min(u[c]["naive"] for c in cases)}


def summary_line(s: dict) -> str:
    keys = ("parallel_configs", "controls", "three_d_configs", "max_loss_diff", "max_param_diff",
            "steps", "max_loss_diff_fp64", "max_param_diff_fp64", "steps_fp64",
            "uneven_tokens_grad_diff_fixed", "uneven_tokens_grad_diff_naive")
    return "summary: " + " ".join(f"{k}={s[k]:.3g}" if isinstance(s[k], float) else f"{k}={s[k]}"
                                  for k in keys)


def main(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=positive_int, default=3, help="fp32 steps")
    p.add_argument("--steps-fp64", type=positive_int, default=10, help="fp64 steps")
    p.add_argument("--batch-size", type=positive_int, default=8, help="global batch (a multiple of 8)")
    p.add_argument("--lr", type=positive_float, default=seed.LR)
    p.add_argument("--configs", nargs="+", default=list(NAMES), metavar="NAME",
                   help="a subset of the configurations (quoted names)")
    args = p.parse_args(argv)
    check(args.batch_size, args.configs)
    result = run(args.steps, args.steps_fp64, args.batch_size, args.lr, args.configs)
    s = summary(result)
    print(f"uneven tokens ({', '.join(s['uneven_cases'])}), max |grad - one process|: naive "
          f"{s['uneven_tokens_grad_diff_naive']:.3g}, fixed {s['uneven_tokens_grad_diff_fixed']:.3g}")
    print(summary_line(s))
    return 0


if __name__ == "__main__":
    run_main(main)
