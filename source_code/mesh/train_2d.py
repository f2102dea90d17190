"""2D training: FSDP2 across the "dp" dimension x tensor parallelism inside the "tp" dimension.

    torchrun --standalone --nproc-per-node=4 -m source_code.mesh.train_2d --tp 2
    torchrun --standalone --nproc-per-node=4 -m source_code.mesh.train_2d --tp 4 --steps 40
    sbatch slurm/tp_dp_2d.slurm            # on a cluster: TP inside a node, FSDP across nodes

The mesh is (dp = world / tp, tp); the last dimension varies fastest, so a tp group is tp
consecutive ranks: the processes of one node under torchrun or Slurm. TP sends activations
twice per block forward and backward (the most frequent, latency-bound messages) and stays on
the node's fast links; FSDP's all-gathers and reduce-scatters of parameters cross the nodes.
A --tp that does not divide the processes of a node is refused for that reason.

The TransformerLM learns the generated sort task; each dp group takes its B/dp samples of the
global batch, the tp ranks of a group see the same samples. Rank 0 prints progress; last line:

    summary: world_size=4 epochs=1 accuracy=A seconds=S dp=2 tp=2 steps=K loss=L
"""
from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from source_code.cli import Parser, positive_float, positive_int
from source_code.distributed import LaunchError, print0, ranks_from_env, run_main, session
from source_code.mesh.tp import build_2d, check_divisible
from source_code import workload
from source_code.tensor_parallel.placement import check_tp_in_node
from source_code.training import loop

LAUNCH = "torchrun --standalone --nproc-per-node=4 -m source_code.mesh.train_2d --tp 2"


def parse_args(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--tp", type=positive_int, default=2, help="tensor-parallel size (within a node)")
    p.add_argument("--steps", type=positive_int, default=20)
    p.add_argument("--batch-size", type=positive_int, default=32, help="GLOBAL batch, divided among dp")
    p.add_argument("--lr", type=positive_float, default=3e-3)
    p.add_argument("--dim", type=positive_int, default=64)
    p.add_argument("--layers", type=positive_int, default=2)
    p.add_argument("--heads", type=positive_int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=positive_int, default=5)
    return p.parse_args(argv)


def check(args, env=None) -> tuple[int, int]:
    """Every flag against the launch, before the process group: (dp, tp) or a LaunchError."""
    env = os.environ if env is None else env
    found = ranks_from_env(env)
    world = found[2] if found else 1
    if world % args.tp:
        raise LaunchError(f"error: world size {world} is not divisible by --tp {args.tp}; "
                          f"use a --tp that divides {world}")
    check_tp_in_node(args.tp, world, env)
    if args.dim % args.heads:
        raise LaunchError(f"error: --dim {args.dim} must be a multiple of --heads {args.heads}")
    why = check_divisible({"n_heads": args.heads}, args.tp)
    if why:
        raise LaunchError(f"error: {why}; use --heads a multiple of --tp {args.tp}")
    dp = world // args.tp
    if args.batch_size % dp:
        raise LaunchError(f"error: --batch-size {args.batch_size} does not divide among {dp} dp "
                          f"groups; use a multiple of {dp}")
    return dp, args.tp


def train(ctx, args, dp: int, tp: int) -> dict:
    cfg = workload.model_config(dim=args.dim, n_layers=args.layers, n_heads=args.heads)
    mesh = init_device_mesh(ctx.device.type, (dp, tp), mesh_dim_names=("dp", "tp"))
    model = build_2d(workload.build_model(cfg, args.seed, ctx.device), mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    train_set, held_out = workload.sort_task(n=2048), workload.sort_task(n=2048)
    x_test, y_test = (t[-256:].to(ctx.device) for t in held_out.tensors)
    me = mesh["dp"].get_local_rank()
    n_params = sum(p.numel() for p in model.parameters())
    hosts = [None] * ctx.world_size
    dist.all_gather_object(hosts, socket.gethostname())
    for group in mesh.mesh.tolist():                     # the rows of the mesh: the tp groups
        print0(f"tp group {group} on {', '.join(sorted({hosts[r] for r in group}))}")
    print0(f"2D training: mesh {mesh.mesh.tolist()} (dp={dp} x tp={tp}), TransformerLM "
           f"{n_params:,d} parameters, global batch {args.batch_size} ({args.batch_size // dp} "
           f"per dp group), {ctx.backend} on {ctx.device.type}")
    timer, loss = loop.Timer(), float("nan")
    for step in range(args.steps):
        x, y = workload.rank_slice(workload.global_batch(train_set, step, args.batch_size, args.seed),
                                   me, dp)
        loss_t = workload.loss_fn(model, x.to(ctx.device), y.to(ctx.device))
        loss_t.backward()
        opt.step()
        opt.zero_grad()
        if (step + 1) % args.log_every == 0 or step + 1 == args.steps:
            mean = loss_t.detach().reshape(1).cpu()
            dist.all_reduce(mean)                        # every rank: tp copies count equally
            loss = mean.item() / ctx.world_size
            print0(f"step {step + 1:4d}/{args.steps}  loss {loss:.4f}  {timer.seconds:6.1f}s")
    accuracy = workload.token_accuracy(model, x_test, y_test)   # collective: every rank
    print0(loop.summary_line(ctx.world_size, 1, accuracy, timer.seconds)
           + f" dp={dp} tp={tp} steps={args.steps} loss={loss:.4f}")
    return {"accuracy": accuracy}


def main(argv=None):
    args = parse_args(argv)
    dp, tp = check(args)
    torch.set_num_threads(1)  # one core per process: on CPU the processes are the parallelism
    with session(launch_hint=LAUNCH, allow_single=True, seed=args.seed) as ctx:
        train(ctx, args, dp, tp)
    return 0


if __name__ == "__main__":
    run_main(main)
