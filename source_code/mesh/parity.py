"""2D parity: FSDP2 on "dp" x TP on "tp" trains exactly like one process on the global batch.

    torchrun --standalone --nproc-per-node=4 -m source_code.mesh.parity            # 2 x 2
    torchrun --standalone --nproc-per-node=4 -m source_code.mesh.parity --tp 4     # 1 x 4

Every rank builds the same full TransformerLM (workload.init_weights: seeded per parameter),
then keeps its shards (tp.build_2d). The dp rank takes its B/dp samples of each global batch;
the tp ranks of one dp group see the same samples. After ``--steps`` SGD steps (reference.make_optimizer) every weight
is gathered (``full_tensor()``) and compared with the one-process reference, trained on the
same device. Last line:

    parity: mesh=dp2xtp2 device=cuda steps=S loss_diff=L max_abs_diff=D tol=T

The mesh and the model live on this rank's device (``distributed.context().device``): one GPU
per process under torchrun on a GPU node (TF32 off, tolerance 1e-5: reference.exact), the CPU
with gloo otherwise (tolerance 1e-6); ``--tol`` overrides the tolerance.
"""
from __future__ import annotations

import logging

import torch
from torch.distributed.device_mesh import init_device_mesh

from source_code.cli import Parser, positive_float, positive_int
from source_code.distributed import LaunchError, context, print0, ranks_from_env, run_main, session
from source_code.mesh import reference
from source_code.mesh.tp import build_2d, check_divisible
from source_code.workload import lm_loss
from source_code import workload
from source_code.measure import is_dtensor

LAUNCH = "torchrun --standalone --nproc-per-node=4 -m source_code.mesh.parity"


def quiet_redistribute_warnings() -> None:
    """full_tensor() of a (StridedShard, Shard) weight warns that it takes two all-gathers:
    true, and harmless for a comparison done once."""
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)


def full_weights(model) -> dict:
    """name -> full tensor (a collective for DTensors: every rank of the mesh calls it)."""
    return {n: (p.full_tensor() if is_dtensor(p) else p).detach().clone()
            for n, p in model.named_parameters()}


def run_2d(dp: int, tp: int, steps: int = 3, batch_size: int = 16, lr: float = 0.1,
           seed: int = 0, dim: int = 64, layers: int = 2, heads: int = 4) -> dict:
    """Train on a dp x tp mesh (call on all dp*tp ranks); compare with the reference on rank 0.

    Returns {"loss_diff", "max_abs_diff", "placements" (name -> str), "losses", "device",
    "tol"} on every rank (diffs are computed on every rank against its own reference, on the
    same device: the model is tiny)."""
    quiet_redistribute_warnings()
    device = context().device
    tol = reference.exact(device)
    cfg = workload.model_config(dim=dim, n_layers=layers, n_heads=heads)
    mesh = init_device_mesh(device.type, (dp, tp), mesh_dim_names=("dp", "tp"))
    model = build_2d(workload.build_model(cfg, seed, device), mesh)
    opt = reference.make_optimizer(model.parameters(), lr)
    data = reference.batches(steps, batch_size, seed)
    me = mesh["dp"].get_local_rank()
    losses = []
    for x, y in data:
        xs, ys = (t.to(device) for t in workload.rank_slice((x, y), me, dp))
        # this slice's share of the global mean; FSDP2 averages over dp, so x dp to add up
        loss = lm_loss(model(xs), ys, reference.n_valid(y)) * dp
        loss.backward()
        opt.step()
        opt.zero_grad()
        total = loss.detach() / dp
        torch.distributed.all_reduce(total, group=mesh["dp"].get_group())
        losses.append(total.item())
    got = full_weights(model)
    placements = {n: str(tuple(p.placements)) for n, p in model.named_parameters()}
    want, ref_losses = reference.train_reference(cfg, seed, data, lr, device)
    return {"loss_diff": max(abs(a - b) for a, b in zip(losses, ref_losses)),
            "max_abs_diff": max((got[n] - want[n]).abs().max().item() for n in want),
            "placements": placements, "losses": losses, "device": device.type, "tol": tol}


def main(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--tp", type=positive_int, default=2, help="tensor-parallel size (heads must divide)")
    p.add_argument("--steps", type=positive_int, default=3)
    p.add_argument("--batch-size", type=positive_int, default=16, help="global batch")
    p.add_argument("--lr", type=positive_float, default=0.1)
    p.add_argument("--tol", type=positive_float, default=None,
                   help="max |weight difference| (default: 1e-6 on the CPU, 1e-5 on CUDA)")
    args = p.parse_args(argv)
    found = ranks_from_env()
    world = found[2] if found else 1
    if world % args.tp:
        raise LaunchError(f"error: world size {world} is not divisible by --tp {args.tp}; "
                          f"use a --tp that divides {world}")
    dp = world // args.tp
    why = check_divisible(workload.model_config(), args.tp)
    if why or args.batch_size % dp:
        raise LaunchError(f"error: {why or f'--batch-size {args.batch_size} does not divide among {dp} dp ranks'}")
    torch.set_num_threads(1)
    with session(launch_hint=LAUNCH, allow_single=True):
        r = run_2d(dp, args.tp, args.steps, args.batch_size, args.lr)
        tol = args.tol or r["tol"]
        print0(f"parity: mesh=dp{dp}xtp{args.tp} device={r['device']} steps={args.steps} "
               f"loss_diff={r['loss_diff']:.3g} max_abs_diff={r['max_abs_diff']:.3g} tol={tol:g}")
    return 0 if r["max_abs_diff"] <= tol else 1


if __name__ == "__main__":
    run_main(main)
