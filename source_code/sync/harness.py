"""Checks of the synchronisation code: the all-reduce implementations against dist.all_reduce,
and the parameter server against DDP. Not lesson code: the lessons are ``comms.py`` and
``parameter_server.py``; this file runs them side by side.

    python -m source_code.sync.harness      # both checks on 3 processes
"""
from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.nn.utils import parameters_to_vector

from source_code.distributed import context
from source_code.sync.comms import IMPLEMENTATIONS, OPS, library_all_reduce, ring_all_reduce, wait_all
from source_code.sync.parameter_server import SERVER, worker_batches, train_parameter_server
from source_code.training import loop


def compare_with_library(sizes=(1, 5, 1001, 4099), ops=OPS, seed: int = 0) -> dict:
    """Run on every rank of a group: max |ours - dist.all_reduce| per (implementation, size, op).

    Each rank draws different data (seed + rank). Sizes include ones smaller than and not
    divisible by the world size. "ring_small_segments" cuts chunks into 64-byte segments: the
    pipelined path that big buffers take."""
    rank = dist.get_rank()
    device = context().device  # the device policy's choice for this process
    out = {}
    for size in sizes:
        x = torch.randn(size, generator=torch.Generator().manual_seed(seed + 1000 * rank + size),
                        dtype=torch.float64).to(device)
        for op in ops:
            expected = library_all_reduce(x.clone(), op)
            for name in ("ring", "ring_small_segments", "naive_ring", "parameter_server"):
                if name == "ring_small_segments":
                    got = ring_all_reduce(x.clone(), op, segment_bytes=64)
                else:
                    got = IMPLEMENTATIONS[name](x.clone(), op)
                out[(name, size, op)] = float((got - expected).abs().max())
    return out


def train_ddp(args, device, workers_group) -> torch.Tensor:
    """DDP on the worker ranks only, same data and optimizer; returns the final flat weights."""
    n_workers = dist.get_world_size() - 1
    model, opt = loop.build(args, device)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None, process_group=workers_group)
    batches = iter(worker_batches(n_workers, dist.get_rank() - 1, args.batch_size, args.seed))
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
        wait_all(dist.batch_isend_irecv([dist.P2POp(dist.irecv, ddp_weights, 1)]))
    elif rank == 1:
        wait_all(dist.batch_isend_irecv([dist.P2POp(dist.isend, ddp_weights, SERVER)]))
    server_weights = ps_weights.clone()
    dist.broadcast(server_weights, SERVER)
    result = torch.tensor([float((ps_weights - ddp_weights).abs().max()) if rank == SERVER else 0.0,
                           float((ps_weights - server_weights).abs().max())], dtype=torch.float64, device=device)
    dist.all_reduce(result, op=dist.ReduceOp.MAX)
    dist.destroy_process_group(workers_group)
    return {"max_abs_diff": float(result[0]), "pull_diff": float(result[1]), "losses": losses,
            "max_weight_change": moved, "parameters": ps_weights.numel(), "world_size": world}


def _both_checks() -> dict:
    return {"all_reduce": compare_with_library(), "ps_vs_ddp": ps_vs_ddp(steps=10)}


def main():
    from source_code.processes import spawn
    res = spawn(_both_checks, 3)[0]
    worst = max(res["all_reduce"].values())
    print(f"3 processes, sizes (1, 5, 1001, 4099), sum and avg: max |ours - dist.all_reduce| = {worst:.2e}")
    print(f"parameter server vs DDP after 10 steps: max |difference| = {res['ps_vs_ddp']['max_abs_diff']:.2e}")


if __name__ == "__main__":
    main()
