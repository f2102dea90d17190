"""A parameter server on torch.distributed: rank 0 serves, the other ranks are workers.

Each step: workers pull the weights from the server, compute gradients on their share of the
global batch, push the gradients; the server averages them and applies the optimizer. With the
same data order and plain SGD this is the same arithmetic as DDP, so ``ps_vs_ddp`` trains the
digits SmallCNN both ways in one process group (DDP runs on a subgroup of the workers) and
reports the largest weight difference.

    torchrun --standalone --nproc-per-node=3 -m source_code.sync.parameter_server      # server + 2 workers
    torchrun --standalone --nproc-per-node=5 -m source_code.sync.parameter_server --steps 40

``ps_all_reduce`` is the same pattern as a collective (gather to one rank, sum, send back),
used by the benchmark next to the ring.
"""
from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.nn.utils import parameters_to_vector, vector_to_parameters
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from source_code.cli import Parser, positive_float, positive_int
from source_code import data
from source_code.distributed import context, print0, run_main, session
from source_code.training import loop

LAUNCH = "torchrun --standalone --nproc-per-node=3 -m source_code.sync.parameter_server"
SERVER = 0


def _wait(ops):
    for work in dist.batch_isend_irecv(ops) if ops else []:
        work.wait()


def ps_all_reduce(tensor: torch.Tensor, op: str = "sum", group=None, root: int = 0):
    """In-place all-reduce through one rank: everyone sends its buffer to ``root``, which sums
    and sends the result back. The root's link carries 2 (N-1) x the buffer; returns ``tensor``."""
    from source_code.sync.ring_allreduce import _check_input
    _check_input(tensor, op)
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
    me, world = dist.get_rank(), len(ranks)
    root = ranks[root]
    if world == 1:
        return tensor
    if me == root:
        inbox = [torch.empty_like(tensor) for _ in range(world - 1)]
        _wait([dist.P2POp(dist.irecv, buf, r, group) for buf, r in zip(inbox, [r for r in ranks if r != root])])
        for buf in inbox:
            tensor.add_(buf)
        if op == "avg":
            tensor.div_(world)
        _wait([dist.P2POp(dist.isend, tensor, r, group) for r in ranks if r != root])
    else:
        _wait([dist.P2POp(dist.isend, tensor, root, group)])
        _wait([dist.P2POp(dist.irecv, tensor, root, group)])
    return tensor


def _worker_batches(n_workers: int, worker: int, batch_size: int, seed: int):
    """The same shard of the same shuffled order that DDP's DistributedSampler gives this worker."""
    train_set = data.load("digits", "train")
    sampler = DistributedSampler(train_set, num_replicas=n_workers, rank=worker, shuffle=True, seed=seed)
    return DataLoader(train_set, batch_size=loop.per_rank_batch(batch_size, n_workers), sampler=sampler)


def train_parameter_server(args, device) -> tuple[torch.Tensor, list, float]:
    """Run the parameter-server training; returns (final flat weights on this rank, server
    losses, largest change of a weight since the start)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    n_workers = world - 1
    model, opt = loop.build(args, device)  # identical initial weights on every rank (seeded)
    flat = parameters_to_vector(model.parameters()).detach()
    initial = flat.clone()
    losses = []
    batches = iter(_worker_batches(n_workers, rank - 1, args.batch_size, args.seed)) if rank != SERVER else None
    for step in range(args.steps + 1):
        # pull: the server sends the current weights to every worker
        if rank == SERVER:
            flat = parameters_to_vector(model.parameters()).detach()
            _wait([dist.P2POp(dist.isend, flat, w) for w in range(1, world)])
        else:
            _wait([dist.P2POp(dist.irecv, flat, SERVER)])
            vector_to_parameters(flat, model.parameters())
        if step == args.steps:  # the last pull only distributes the final weights
            break
        if rank == SERVER:
            # push (receive side) + aggregate + update: only the server runs the optimizer
            grads = [torch.empty_like(flat) for _ in range(n_workers)]
            loss_buf = torch.zeros(n_workers, dtype=torch.float64, device=device)
            _wait([dist.P2POp(dist.irecv, g, w) for w, g in enumerate(grads, start=1)]
                  + [dist.P2POp(dist.irecv, loss_buf[w - 1:w], w) for w in range(1, world)])
            mean_grad = torch.stack(grads).mean(0)
            _set_grads(model, mean_grad)
            opt.step()
            losses.append(float(loss_buf.mean()))
        else:
            x, y = next(batches)
            model.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x.to(device)), y.to(device))
            loss.backward()
            grad = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
            loss_t = torch.tensor([loss.item()], dtype=torch.float64, device=device)
            _wait([dist.P2POp(dist.isend, grad, SERVER), dist.P2POp(dist.isend, loss_t, SERVER)])
    final = parameters_to_vector(model.parameters()).detach()
    return final, losses, float((final - initial).abs().max())


def _set_grads(model, flat_grad):
    offset = 0
    for p in model.parameters():
        n = p.numel()
        p.grad = flat_grad[offset:offset + n].view_as(p).clone()
        offset += n


def train_ddp(args, device, workers_group) -> torch.Tensor:
    """DDP on the worker ranks only, same data and optimizer; returns the final flat weights."""
    n_workers = dist.get_world_size() - 1
    model, opt = loop.build(args, device)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None, process_group=workers_group)
    batches = iter(_worker_batches(n_workers, dist.get_rank() - 1, args.batch_size, args.seed))
    for _ in range(args.steps):
        x, y = next(batches)
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(ddp(x.to(device)), y.to(device)).backward()
        opt.step()
    return parameters_to_vector(model.parameters()).detach()


def ps_vs_ddp(steps: int = 20, batch_size: int = 64, lr: float = 0.05, momentum: float = 0.0,
              seed: int = 0) -> dict:
    """Run on every rank (world size >= 3): parameter-server training, then DDP on the workers.

    Returns on every rank: ``max_abs_diff`` between the server's final weights and the DDP
    weights, ``pull_diff`` (do the workers hold the server's weights?), the server's losses and
    ``max_weight_change`` (how far training moved the weights: the comparison is not trivial).
    """
    args = argparse.Namespace(dataset="digits", model="smallcnn", steps=steps, batch_size=batch_size,
                              lr=lr, momentum=momentum, seed=seed)
    rank, world = dist.get_rank(), dist.get_world_size()
    if world < 3:
        raise ValueError(f"ps_vs_ddp needs a server and at least 2 workers: world size {world} < 3")
    device = context().device
    workers_group = dist.new_group(list(range(1, world)))  # every rank must take part in new_group
    ps_weights, losses, moved = train_parameter_server(args, device)
    ddp_weights = train_ddp(args, device, workers_group) if rank != SERVER else torch.empty_like(ps_weights)
    # the server receives worker 1's DDP weights and compares; everyone learns the result
    if rank == SERVER:
        _wait([dist.P2POp(dist.irecv, ddp_weights, 1)])
    elif rank == 1:
        _wait([dist.P2POp(dist.isend, ddp_weights, SERVER)])
    server_weights = ps_weights.clone()
    dist.broadcast(server_weights, SERVER)
    result = torch.tensor([float((ps_weights - ddp_weights).abs().max()) if rank == SERVER else 0.0,
                           float((ps_weights - server_weights).abs().max())], dtype=torch.float64, device=device)
    dist.all_reduce(result, op=dist.ReduceOp.MAX)
    dist.destroy_process_group(workers_group)
    return {"max_abs_diff": float(result[0]), "pull_diff": float(result[1]), "losses": losses,
            "max_weight_change": moved,
            "parameters": ps_weights.numel(), "world_size": world}


def main(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=positive_int, default=20)
    p.add_argument("--batch-size", type=positive_int, default=64, help="global batch, divided among the workers")
    p.add_argument("--lr", type=positive_float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    with session(launch_hint=LAUNCH) as ctx:
        if ctx.world_size < 3:
            print0(f"error: a server and at least 2 workers are needed; run: {LAUNCH}")
            return 2
        loop.per_rank_batch(args.batch_size, ctx.world_size - 1)
        out = ps_vs_ddp(args.steps, args.batch_size, args.lr, 0.0, args.seed)
        for i, loss in enumerate(out["losses"]):
            if i % 5 == 0 or i == len(out["losses"]) - 1:
                print0(f"step {i + 1:3d}  mean worker loss {loss:.4f}")
        print0(f"{ctx.world_size - 1} workers + 1 server, {out['parameters']} parameters, "
               f"{args.steps} steps of plain SGD moved the weights by up to {out['max_weight_change']:.3f}")
        print0(f"ps_vs_ddp_max_abs_diff={out['max_abs_diff']:.3e} workers_hold_server_weights_diff={out['pull_diff']:.1e}")
    return 0


if __name__ == "__main__":
    run_main(main)
