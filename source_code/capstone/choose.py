"""Choose your configuration: dp, tp, pp, cp, ep sizes (and a ZeRO stage) for a world size.

    python -m source_code.capstone.choose --world 4 --dp 2 --tp 2 --zero 3
    python -m source_code.capstone.choose --world 2 --pp 2
    python -m source_code.capstone.choose --world 4 --dp 2 --cp 2
    torchrun --standalone --nproc-per-node=4 -m source_code.capstone.choose --dp 2 --cp 2
    sbatch slurm/capstone.slurm                  # 8 processes on 2 nodes: --dp 4 --cp 2

``plan(world, dp=..., ...)`` refuses an impossible configuration in one line (sizes that do
not multiply to the world size, heads not divisible by tp, layers by pp, experts by ep, the
sequence by 2 x cp, the batch by the data-parallel pieces) and names the runner that trains
it: data parallelism alone (--zero 0: DDP, 1 and 2: ZeRO by hand, 3: FSDP2), or data
parallelism times ONE other kind (tp, pp, cp or ep). ``run`` trains it in ``world`` CPU
processes from the seed checkpoint on the same global batches as one process and compares
(the 3-D pipeline x data x tensor mesh is notebook 12's ``mesh.pipeline3d``). Under torchrun
(or srun) the processes of the launch are the world, on as many nodes as it has: every rank
writes the seed checkpoint (the same bytes: init is seeded per parameter) to its own
temporary directory, so no shared file system is needed. Last line:

    summary: world=W dp=.. tp=.. pp=.. cp=.. ep=.. zero=Z loss_diff=L weight_diff=D
"""
from __future__ import annotations

import os
import tempfile

from source_code.capstone import runners_combo, runners_dp, runners_model, seed
from source_code.capstone.matrix import measure, references
from source_code.cli import Parser, nonnegative_int, positive_int
from source_code.distributed import print0, ranks_from_env, session
from source_code.errors import LaunchError, run_main

SIZES = ("dp", "tp", "pp", "cp", "ep")
SEQ = 32                        # tokens of the sort task
LAUNCH = "torchrun --standalone --nproc-per-node=4 -m source_code.capstone.choose --dp 2 --cp 2"


def plan(world: int, dp: int = 1, tp: int = 1, pp: int = 1, cp: int = 1, ep: int = 1,
         zero: int = 0, batch_size: int = 8, cfg: dict | None = None) -> str:
    """The runner's description, or a LaunchError naming what to change."""
    cfg = cfg or seed.config()
    sizes = {"dp": dp, "tp": tp, "pp": pp, "cp": cp, "ep": ep}
    if any(v < 1 for v in sizes.values()):
        raise LaunchError("error: every size must be >= 1")
    product = dp * tp * pp * cp * ep
    if product != world:
        raise LaunchError(f"error: dp x tp x pp x cp x ep = {product}, not the world size {world}; "
                          f"make the sizes multiply to {world}")
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
    others = [k for k in ("tp", "pp", "cp", "ep") if sizes[k] > 1]
    if len(others) > 1:
        raise LaunchError(f"error: {' x '.join(others)}: this capstone combines data parallelism with ONE "
                          "other kind; pp x dp x tp is notebook 12's python -m source_code.mesh.pipeline3d")
    pieces = dp * (runners_model.MICROBATCHES if pp > 1 else 1) * (ep if ep > 1 else 1)
    if batch_size % pieces:
        raise LaunchError(f"error: --batch-size {batch_size} does not split into {pieces} pieces "
                          f"(dp{' x microbatches' if pp > 1 else ''}{' x ep' if ep > 1 else ''}); use a multiple of {pieces}")
    other = others[0] if others else None
    if other == "tp" and dp > 1 and zero != 3:
        raise LaunchError("error: dp x tp shards over dp with FSDP2: use --zero 3")
    if other and other != "tp" and zero:
        raise LaunchError(f"error: --zero {zero} applies to data parallelism alone (or dp x tp with 3); use --zero 0")
    if other is None:
        return {0: "DDP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "FSDP2"}[zero] + f" on {dp}"
    kinds = {"tp": "DTensor TP", "pp": "1F1B pipeline", "cp": "ring attention", "ep": "expert parallel"}
    over_dp = {"tp": "FSDP2", "pp": "DP", "cp": "DP", "ep": "DP"}[other]
    return kinds[other] + f" on {sizes[other]}" + (f" x {over_dp} on {dp}" if dp > 1 else "")


def build(path, lr: float, world: int, dp: int, tp: int, pp: int, cp: int, ep: int, zero: int):
    """The runner of a planned configuration (on every rank of a ``world``-process group)."""
    if tp > 1:
        return runners_combo.fsdp_tp(path, lr, dp, tp) if dp > 1 else runners_model.tp_dtensor(path, lr)
    if pp > 1:
        return runners_combo.pp_dp(path, lr, dp, pp)
    if cp > 1:
        return runners_combo.dp_cp(path, lr, dp, cp)
    if ep > 1:
        return runners_model.expert_parallel(path, lr, dp)
    if zero == 3:
        return runners_dp.fsdp(path, lr)
    return runners_dp.zero(path, lr, zero) if zero else runners_dp.data_parallel(path, lr, "ddp")


def train_choice(path, steps: int, batch_size: int, lr: float, sizes: dict) -> dict:
    """On every rank: train the configuration; its loss curve and differences from one process."""
    data = seed.batches(steps, batch_size)
    import torch.distributed as dist
    row = measure(build(path, lr, dist.get_world_size(), **sizes), data, references(path, data, lr))
    row.pop("weights", None)
    return row


def run(world: int, steps: int = 3, batch_size: int = 8, lr: float = seed.LR, **sizes) -> dict:
    """Check the configuration (one line if impossible), then train it in ``world`` processes."""
    sizes = {**{k: 1 for k in SIZES}, "zero": 0, **sizes}
    described = plan(world, batch_size=batch_size, **sizes)
    from source_code.processes import spawn
    with tempfile.TemporaryDirectory() as tmp:
        path = seed.save_seed(os.path.join(tmp, "seed.pt"))
        row = spawn(train_choice, world, path, steps, batch_size, lr, sizes, device="cpu")[0]
    return {**row, "configuration": described, **sizes, "world": world}


def summary_line(r: dict) -> str:
    return (f"summary: world={r['world']} " + " ".join(f"{k}={r[k]}" for k in (*SIZES, "zero"))
            + f" loss_diff={r['loss_diff']:.3g} weight_diff={r['param_diff']:.3g}")


def main(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=positive_int, default=None,
                   help="processes to start (default 4; under torchrun: the launch's)")
    for name in SIZES:
        p.add_argument(f"--{name}", type=positive_int, default=1)
    p.add_argument("--zero", type=nonnegative_int, default=0, help="0 DDP, 1/2 ZeRO, 3 FSDP2")
    p.add_argument("--steps", type=positive_int, default=3)
    p.add_argument("--batch-size", type=positive_int, default=8)
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
                r = {**train_choice(path, args.steps, args.batch_size, seed.LR, sizes), **sizes,
                     "world": world}
            report_result(r)       # inside the session: print0 still knows the ranks
    else:
        print(f"configuration: {described}")
        report_result(run(world, args.steps, args.batch_size, **sizes))
    return 0


def report_result(r: dict) -> None:
    print0(f"loss per step {', '.join(f'{v:.4f}' for v in r['losses'])}")
    print0(summary_line(r))


if __name__ == "__main__":
    run_main(main)
