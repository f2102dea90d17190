"""DDP training under torchrun: the workshop's main job.

    torchrun --standalone --nproc-per-node=2 -m source_code.training.ddp
    torchrun --standalone --nproc-per-node=2 -m source_code.training.ddp --epochs 2 --checkpoint snap.pt
    torchrun --standalone --nproc-per-node=2 -m source_code.training.ddp --epochs 4 --checkpoint snap.pt --resume

Compared with single.py, the changes that make it data-parallel are marked (1)-(6).
gloo + CPU here, NCCL + cuda:LOCAL_RANK on a GPU node: the same file. ddp_fault_tolerant.py
is this script plus what survives a killed process (notebook 07 shows the difference).
"""
from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from source_code import checkpoint, data
from source_code.cli import Parser
from source_code.distributed import all_reduce_mean, print0, run_main, seed_everything, settle, whoami
from source_code.training import loop

LAUNCH = "torchrun --standalone --nproc-per-node=2 -m source_code.training.ddp"


def train(me, args) -> dict:
    # (2) each process gets its share of the global batch
    batch = loop.per_rank_batch(args.batch_size, me.world_size)
    train_set = data.load(args.dataset, "train", args.data_dir)
    # (3) DistributedSampler: a disjoint shard of a shuffled order per rank, same order on all
    sampler = DistributedSampler(train_set, num_replicas=me.world_size, rank=me.rank,
                                 shuffle=True, seed=args.seed)
    # pinned host memory + several loader workers on a GPU node (see loop.loader)
    loader = loop.loader(train_set, batch, me.device, args.workers, sampler=sampler)
    test_loader = DataLoader(data.load(args.dataset, "test", args.data_dir), batch_size=256)

    model, opt = loop.build(args, me.device)
    start_epoch = 0
    if args.resume and os.path.exists(args.checkpoint):
        start_epoch = checkpoint.load_snapshot(args.checkpoint, model, opt)["epoch"]
        print0(f"resumed from {args.checkpoint} after epoch {start_epoch}")
    elif args.resume:
        print0(f"no snapshot at {args.checkpoint} yet: starting from scratch")
    # (4) wrap the model: gradients are averaged across ranks during backward()
    model = DDP(model, device_ids=me.device_ids)

    timer, accuracy = loop.Timer(), 0.0
    print0(f"training {args.model} on {args.dataset}: {len(train_set)} examples, world_size="
           f"{me.world_size}, global batch {args.batch_size} ({batch} per rank), "
           f"{me.backend} on {me.device.type}")
    losses = []
    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)  # (5) a new shuffle every epoch, identical on all ranks
        local_loss, steps = loop.train_epoch(model, loader, opt, me.device, args.max_steps)
        # for reporting only: each rank saw a different shard, all_reduce(AVG) gives the mean
        loss = all_reduce_mean(local_loss)
        losses.append(loss)
        if me.is_main:  # (6) rank 0 evaluates, prints and saves
            accuracy = loop.evaluate(model.module, test_loader, me.device)
        print0(f"epoch {epoch + 1:3d}/{args.epochs}  loss {loss:.4f}  held-out accuracy "
               f"{accuracy:.4f}  steps {steps}  {timer.seconds:6.1f}s")
        if args.checkpoint:
            checkpoint.save_snapshot(args.checkpoint, model, opt, epoch + 1)
    if me.is_main and start_epoch >= args.epochs:
        accuracy = loop.evaluate(model.module, test_loader, me.device)
    print0(loop.summary_line(me.world_size, args.epochs, accuracy, timer.seconds, losses))
    return {"accuracy": accuracy}


def main(argv=None):
    args = loop.add_common_args(Parser(description=__doc__.splitlines()[0])).parse_args(argv)
    loop.check_args(args)
    torch.set_num_threads(1)  # one core per process: on CPU the processes are the parallelism
    # (1) join the process group that torchrun describes (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_*)
    me, store = whoami(LAUNCH)  # + the device policy: cuda:LOCAL_RANK and NCCL, else CPU and gloo
    if me.device.type == "cuda":
        torch.cuda.set_device(me.device)  # this process's own GPU, before any CUDA work
    dist.init_process_group(me.backend, rank=me.rank, world_size=me.world_size, store=store,
                            timeout=datetime.timedelta(minutes=5))  # a collective stuck longer: a hang
    seed_everything(args.seed, me.rank)
    try:
        train(me, args)
        settle()  # the clean-exit detail: free what still uses the group, then a barrier
    finally:
        dist.destroy_process_group()  # leave the group: every rank, also after an error
    return 0


if __name__ == "__main__":
    run_main(main)
