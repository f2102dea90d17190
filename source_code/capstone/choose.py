"""Choose your configuration: dp, tp, pp, cp, ep sizes (and a ZeRO stage) for a world size.

    python -m source_code.capstone.choose --world 4 --dp 2 --tp 2 --zero 3
    python -m source_code.capstone.choose --world 8 --pp 2 --dp 2 --tp 2
    python -m source_code.capstone.choose --world 8 --dp 2 --tp 2 --cp 2 --dtype fp64 --steps 10
    torchrun --standalone --nproc-per-node=4 -m source_code.capstone.choose --dp 2 --cp 2
    sbatch slurm/capstone.slurm                  # 8 processes on 2 nodes: --pp 2 --dp 2 --tp 2

``plan(world, dp=..., ...)`` refuses an impossible configuration in one line (sizes that do
not multiply to the world size, heads not divisible by tp, layers by pp, experts by ep, the
sequence by 2 x cp, the batch by the data-parallel pieces, a combination no runner here
trains) and names the runner that trains it. The runners combine:

* data parallelism alone: --zero 0 DDP, 1 and 2 ZeRO by hand, 3 FSDP2;
* any of pipeline (pp), tensor (tp) parallelism with data parallelism: pp x dp is two 1F1B
  pipelines (our schedule), pp x tp (x dp) is torch's GPipe on TP stages (mesh.pipeline3d),
  tp x dp is FSDP2 with --zero 3, plain data parallelism with --zero 0;
* any of context (cp), tensor (tp) and data parallelism (runners_3d.dp_tp_cp);
* expert parallelism (ep) with data parallelism (the MoE model).

Refused, as no runner here trains them: pipeline with context parallelism; expert parallelism
with any model-parallel kind (tensor, pipeline or context); a ZeRO stage (--zero 1-3) with a
model-parallel kind, but for FSDP2 (--zero 3) with tensor parallelism.
``run`` trains the configuration in ``world`` CPU processes from the seed checkpoint on the
same global batches as one process and compares. Under torchrun (or srun) the processes of
the launch are the world, on as many nodes as it has: every rank writes the seed checkpoint
(the same bytes: init is seeded per parameter) to its own temporary directory, so no shared
file system is needed. Last line:

    summary: world=W dp=.. tp=.. pp=.. cp=.. ep=.. zero=Z dtype=D steps=S loss_diff=L weight_diff=W
"""
from __future__ import annotations

import os
import tempfile

import torch

from source_code import torch_versions
from source_code.capstone import compare, runners_3d, runners_combo, runners_dp, runners_model, seed
from source_code.capstone.runner import Spec
from source_code.capstone.runners_pipeline import MICROBATCHES
from source_code.cli import Parser, nonnegative_int, positive_int
from source_code.distributed import print0, ranks_from_env, session
from source_code.errors import LaunchError, run_main

SIZES = ("dp", "tp", "pp", "cp", "ep")
SEQ = 32                        # tokens of the sort task
DTYPES = {"fp32": torch.float32, "fp64": torch.float64}
LAUNCH = "torchrun --standalone --nproc-per-node=4 -m source_code.capstone.choose --dp 2 --cp 2"


def _check_sizes(world: int, sizes: dict, zero: int, cfg: dict) -> None:
    if any(v < 1 for v in sizes.values()):
        raise LaunchError("error: every size must be >= 1")
    product = sizes["dp"] * sizes["tp"] * sizes["pp"] * sizes["cp"] * sizes["ep"]
    if product != world:
        raise LaunchError(f"error: dp x tp x pp x cp x ep = {product}, not the world size {world}; "
                          f"make the sizes multiply to {world}")
    tp, pp, cp, ep = sizes["tp"], sizes["pp"], sizes["cp"], sizes["ep"]
    if cfg["n_heads"] % tp:
        raise LaunchError(f"error: {cfg['n_heads']} heads do not divide among tp={tp}; use a tp that divides {cfg['n_heads']}")
    if cfg["n_layers"] % pp:
        raise LaunchError(f"error: {cfg['n_layers']} layers do not divide into pp={pp} stages; use a pp that divides {cfg['n_layers']}")
    if seed.N_EXPERTS % ep:
        raise LaunchError(f"error: {seed.N_EXPERTS} experts do not divide among ep={ep}; use an ep that divides {seed.N_EXPERTS}")
    if SEQ % (2 * cp):
        raise LaunchError(f"error: the sequence of {SEQ} tokens does not split into 2 x cp = {2 * cp} "
                          f"zigzag chunks; use a cp with {SEQ} divisible by 2 x cp")
    if zero not in (0, 1, 2, 3):
        raise LaunchError(f"error: --zero {zero}: use 0 (DDP), 1 or 2 (ZeRO by hand) or 3 (FSDP2)")


def _check_combination(kinds: set, dp: int, zero: int) -> None:
    if "ep" in kinds and kinds != {"ep"}:
        raise LaunchError(f"error: {' x '.join(sorted(kinds))}: expert parallelism combines with data "
                          "parallelism only here (the MoE model); drop ep or the other kinds")
    if {"pp", "cp"} <= kinds:
        raise LaunchError("error: pp x cp: no runner here combines pipeline and context parallelism; "
                          "use pp x dp x tp or dp x tp x cp")
    if zero and kinds and not (kinds == {"tp"} and dp > 1 and zero == 3):
        raise LaunchError(f"error: --zero {zero} applies to data parallelism alone (0-3) or dp x tp "
                          "(3: FSDP2); use --zero 0")


def plan(world: int, dp: int = 1, tp: int = 1, pp: int = 1, cp: int = 1, ep: int = 1,
         zero: int = 0, batch_size: int = 8, cfg: dict | None = None) -> str:
    """The runner's description, or a LaunchError naming what to change."""
    sizes = {"dp": dp, "tp": tp, "pp": pp, "cp": cp, "ep": ep}
    _check_sizes(world, sizes, zero, cfg or seed.config())
    kinds = {k for k in ("tp", "pp", "cp", "ep") if sizes[k] > 1}
    _check_combination(kinds, dp, zero)
    micro = (runners_3d.MICROBATCHES if tp > 1 else MICROBATCHES) if pp > 1 else 1
    pieces = dp * micro * ep
    if batch_size % pieces:
        raise LaunchError(f"error: --batch-size {batch_size} does not split into {pieces} pieces "
                          f"(dp{' x microbatches' if pp > 1 else ''}{' x ep' if ep > 1 else ''}); "
                          f"use a multiple of {pieces}")
    if zero == 3:                  # the processes run on the CPU with gloo
        torch_versions.require("fsdp2", "cpu")
    if pp > 1 and tp > 1:
        torch_versions.require("gpipe", "cpu")
    if not kinds:
        return {0: "DDP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "FSDP2"}[zero] + f" on {dp}"
    if "ep" in kinds:
        parts = [("expert parallel", ep), ("DP", dp)]
    elif "pp" in kinds:
        parts = ([("torch GPipe pipeline", pp), ("DP", dp), ("DTensor TP", tp)] if tp > 1
                 else [("1F1B pipeline", pp), ("DP", dp)])
    elif zero == 3:
        parts = [("DTensor TP", tp), ("FSDP2", dp)]
    else:
        parts = [("DP", dp), ("DTensor TP", tp), ("ring attention", cp)]
    return " x ".join(f"{what} on {n}" for what, n in parts if n > 1)


def build(spec: Spec, world: int, dp: int = 1, tp: int = 1, pp: int = 1, cp: int = 1, ep: int = 1,
          zero: int = 0):
    """The runner of a planned configuration (on every rank of a ``world``-process group)."""
    if ep > 1:
        return runners_model.expert_parallel(spec, dp)
    if pp > 1:
        return runners_3d.pp_dp_tp(spec, pp, dp, tp) if tp > 1 else runners_combo.pp_dp(spec, dp, pp)
    if tp > 1 and cp == 1 and zero == 3:
        return runners_combo.fsdp_tp(spec, dp, tp)
    if tp > 1 or cp > 1:
        return runners_3d.dp_tp_cp(spec, dp, tp, cp)
    if zero == 3:
        return runners_dp.fsdp(spec)
    return runners_dp.zero(spec, zero) if zero else runners_dp.data_parallel(spec, "ddp")


def train_choice(path, steps: int, batch_size: int, dtype: str, sizes: dict) -> dict:
    """On every rank: train the configuration; its loss curve and differences from one process."""
    import torch.distributed as dist
    from source_code.mesh.parity import quiet_redistribute_warnings
    quiet_redistribute_warnings()
    data = seed.batches(steps, batch_size)
    refs = compare.references(path, data, seed.LR, DTYPES[dtype])
    row = compare.measure(build(Spec(path, seed.LR, DTYPES[dtype]), dist.get_world_size(), **sizes),
                          data, refs)
    row.pop("weights", None)
    return row


def run(world: int, steps: int = 3, batch_size: int = 8, dtype: str = "fp32", **sizes) -> dict:
    """Check the configuration (one line if impossible), then train it in ``world`` processes."""
    sizes = {**{k: 1 for k in SIZES}, "zero": 0, **sizes}
    described = plan(world, batch_size=batch_size, **sizes)
    from source_code.processes import spawn
    with tempfile.TemporaryDirectory() as tmp:
        path = seed.save_seed(os.path.join(tmp, "seed.pt"))
        row = spawn(train_choice, world, path, steps, batch_size, dtype, sizes, device="cpu")[0]
    return {**row, "configuration": described, **sizes, "world": world, "dtype": dtype, "steps": steps}


def summary_line(r: dict) -> str:
    return (f"summary: world={r['world']} " + " ".join(f"{k}={r[k]}" for k in (*SIZES, "zero"))
            + f" dtype={r['dtype']} steps={r['steps']} loss_diff={r['loss_diff']:.3g} "
            f"weight_diff={r['param_diff']:.3g}")


def main(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=positive_int, default=None,
                   help="processes to start (default 4; under torchrun: the launch's)")
    for name in SIZES:
        p.add_argument(f"--{name}", type=positive_int, default=1)
    p.add_argument("--zero", type=nonnegative_int, default=0, help="0 DDP, 1/2 ZeRO, 3 FSDP2")
    p.add_argument("--steps", type=positive_int, default=3)
    p.add_argument("--batch-size", type=positive_int, default=8)
    p.add_argument("--dtype", choices=tuple(DTYPES), default="fp32",
                   help="fp64: every difference from one process near 1e-15")
    args = p.parse_args(argv)
    sizes = {k: getattr(args, k) for k in (*SIZES, "zero")}
    found = ranks_from_env()
    if found and args.world not in (None, found[2]):
        raise LaunchError(f"error: --world {args.world} but the launch has {found[2]} processes; "
                          "leave --world out under torchrun")
    world = found[2] if found else (args.world or 4)
    described = plan(world, batch_size=args.batch_size, **sizes)
    if found:                      # torchrun / srun: this process is one rank of the world
        with session(launch_hint=LAUNCH) as ctx:
            print0(f"configuration: {described} ({ctx.world_size} processes, {ctx.backend})")
            with tempfile.TemporaryDirectory() as tmp:
                path = seed.save_seed(os.path.join(tmp, "seed.pt"))
                r = {**train_choice(path, args.steps, args.batch_size, args.dtype, sizes), **sizes,
                     "world": world, "dtype": args.dtype, "steps": args.steps}
            report_result(r)       # inside the session: print0 still knows the ranks
    else:
        print(f"configuration: {described}")
        report_result(run(world, args.steps, args.batch_size, args.dtype, **sizes))
    return 0


def report_result(r: dict) -> None:
    print0(f"loss per step {', '.join(f'{v:.6f}' for v in r['losses'])}")
    print0(summary_line(r))


if __name__ == "__main__":
    run_main(main)
