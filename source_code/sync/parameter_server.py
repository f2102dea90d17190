"""A parameter server on torch.distributed: rank 0 serves, the other ranks are workers.

Each step: the workers pull the weights from the server, compute gradients on their share of
the global batch and push them; the server averages them and runs the optimizer. Per step the
server's link carries (N-1) x the model in (gradients) and (N-1) x the model out (weights),
N = processes (``source_code.costmodel.traffic``). With the same data order and plain SGD it
is the same arithmetic as DDP: ``source_code.sync.harness.ps_vs_ddp`` checks that.

    torchrun --standalone --nproc-per-node=3 -m source_code.sync.parameter_server      # server + 2 workers
    torchrun --standalone --nproc-per-node=5 -m source_code.sync.parameter_server --steps 40
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.utils import parameters_to_vector, vector_to_parameters
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from source_code import data
from source_code.cli import Parser, positive_float, positive_int
from source_code.distributed import print0, run_main, session
from source_code.sync.comms import wait_all
from source_code.training import loop

LAUNCH = "torchrun --standalone --nproc-per-node=3 -m source_code.sync.parameter_server"
SERVER = 0


def _batch(ops) -> None:
    """Post point-to-point operations as one batch and wait on every Work it returns."""
    wait_all(dist.batch_isend_irecv(ops))


def worker_batches(n_workers: int, worker: int, batch_size: int, seed: int):
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
    batches = iter(worker_batches(n_workers, rank - 1, args.batch_size, args.seed)) if rank != SERVER else None
    for step in range(args.steps + 1):
        # pull: the server sends the current weights to every worker
        if rank == SERVER:
            flat = parameters_to_vector(model.parameters()).detach()
            _batch([dist.P2POp(dist.isend, flat, w) for w in range(1, world)])
        else:
            _batch([dist.P2POp(dist.irecv, flat, SERVER)])
            vector_to_parameters(flat, model.parameters())
        if step == args.steps:  # the last pull only distributes the final weights
            break
        if rank == SERVER:
            # push (receive side) + aggregate + update: only the server runs the optimizer
            grads = [torch.empty_like(flat) for _ in range(n_workers)]
            loss_buf = torch.zeros(n_workers, dtype=torch.float64, device=device)
            _batch([dist.P2POp(dist.irecv, g, w) for w, g in enumerate(grads, start=1)]
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
            _batch([dist.P2POp(dist.isend, grad, SERVER), dist.P2POp(dist.isend, loss_t, SERVER)])
    final = parameters_to_vector(model.parameters()).detach()
    return final, losses, float((final - initial).abs().max())


def _set_grads(model, flat_grad):
    offset = 0
    for p in model.parameters():
        n = p.numel()
        p.grad = flat_grad[offset:offset + n].view_as(p).clone()
        offset += n


def main(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=positive_int, default=20)
    p.add_argument("--batch-size", type=positive_int, default=None,
                   help="global batch, divided among the workers (default: 16 per worker, so that "
                        "any number of processes works: a job of 8 GPUs has 7 workers)")
    p.add_argument("--lr", type=positive_float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    args.dataset, args.model, args.momentum = "digits", "smallcnn", 0.0
    torch.set_num_threads(1)
    with session(launch_hint=LAUNCH) as ctx:
        if ctx.world_size < 3:
            print0(f"error: a server and at least 2 workers are needed; run: {LAUNCH}")
            return 2
        args.batch_size = args.batch_size or 16 * (ctx.world_size - 1)
        loop.per_rank_batch(args.batch_size, ctx.world_size - 1)
        final, losses, moved = train_parameter_server(args, ctx.device)
        if ctx.rank == SERVER:  # only the server has the losses; it is rank 0, which prints
            for i, loss in enumerate(losses):
                if i % 5 == 0 or i == len(losses) - 1:
                    print0(f"step {i + 1:3d}  mean worker loss {loss:.4f}")
            print0(f"summary: workers={ctx.world_size - 1} parameters={final.numel()} steps={args.steps} "
                   f"first_loss={losses[0]:.4f} last_loss={losses[-1]:.4f} max_weight_change={moved:.4f}")
    return 0


if __name__ == "__main__":
    run_main(main)
