"""DDP training that survives a killed process: ddp.py plus snapshots inside the epoch.

    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --standalone --nproc-per-node=2 --max-restarts=1 \\
        -m source_code.training.ddp_fault_tolerant \\
        --epochs 3 --max-steps 6 --checkpoint snap.pt --resume --snapshot-every 2 --crash-at-step 9
    sbatch slurm/ddp_fault_tolerant.slurm --epochs 3 --crash-at-step 30

What it adds to ddp.py (notebook 07 shows the difference line by line):
* --snapshot-every K: a snapshot every K steps inside an epoch, with the sampler's position
  (the step in the epoch) and every rank's running loss, so a restart loses at most K steps;
* resuming inside an epoch: the same shuffled order again (set_epoch), the trained steps skipped;
* --crash-at-step N, the fault drill: once per run rank 1 SIGKILLs itself after the
  N-th global step (on the first attempt that gets there: launch/faults.arm_crash), the way a node failure ends a process; torchrun --max-restarts (or a Slurm
  requeue) then starts every process again, and they resume from the snapshot.
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
from source_code.cli import Parser, nonnegative_int
from source_code.distributed import all_reduce_mean, print0, run_main, seed_everything, settle, whoami
from source_code.launch import faults
from source_code.training import loop

LAUNCH = "torchrun --standalone --nproc-per-node=2 -m source_code.training.ddp_fault_tolerant"


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
    start_epoch, skip, loss_sum = 0, 0, 0.0
    if args.resume and os.path.exists(args.checkpoint):
        snap = checkpoint.load_snapshot(args.checkpoint, model, opt)
        start_epoch = snap["epoch"]
        # a mid-epoch snapshot also knows how far into the epoch it was, and the running losses
        skip = snap["extra"].get("step_in_epoch", 0)
        sums = snap["extra"].get("loss_sums", [])
        loss_sum = sums[me.rank] if len(sums) == me.world_size else sum(sums) / max(len(sums), 1)
        print0(f"resumed from {args.checkpoint} after epoch {start_epoch}"
               + (f", step {skip} of epoch {start_epoch + 1}" if skip else ""))
        print0(f"resumed: epoch={start_epoch} step_in_epoch={skip}")  # the same, for programs to read
    elif args.resume:
        print0(f"no snapshot at {args.checkpoint} yet: starting from scratch")
    # the fault drill: rank 1 SIGKILLs itself after global step --crash-at-step, once per run
    marker = faults.crash_marker(args.checkpoint)
    faults.arm_crash(opt, args.crash_at_step, me.rank, me.world_size,
                     start_epoch * faults.steps_per_epoch(loader, args.max_steps) + skip, marker)
    # (4) wrap the model: gradients are averaged across ranks during backward()
    model = DDP(model, device_ids=me.device_ids)

    timer, accuracy = loop.Timer(), 0.0
    print0(f"training {args.model} on {args.dataset}: {len(train_set)} examples, world_size="
           f"{me.world_size}, global batch {args.batch_size} ({batch} per rank), "
           f"{me.backend} on {me.device.type}")
    losses = []
    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)  # (5) a new shuffle every epoch, identical on all ranks

        def snapshot_mid_epoch(step, loss_so_far, epoch=epoch):  # collective: every rank calls it
            sums = [None] * me.world_size  # each rank's running loss, for the epoch's mean
            dist.all_gather_object(sums, loss_so_far)
            checkpoint.save_snapshot(args.checkpoint, model, opt, epoch,
                                     extra={"step_in_epoch": step, "loss_sums": sums})
        local_loss, steps = loop.train_epoch(model, loader, opt, me.device, args.max_steps,
                                             skip=skip, loss_sum=loss_sum, every=args.snapshot_every,
                                             on_step=snapshot_mid_epoch)
        skip, loss_sum = 0, 0.0  # only the first resumed epoch starts in the middle
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
    if me.is_main and marker and os.path.exists(marker):
        os.remove(marker)  # the drill is over: its crash marker goes
    print0(loop.summary_line(me.world_size, args.epochs, accuracy, timer.seconds, losses))
    return {"accuracy": accuracy}


def main(argv=None):
    parser = loop.add_common_args(Parser(description=__doc__.splitlines()[0]))
    parser.add_argument("--snapshot-every", type=nonnegative_int, default=0,
                        help="also snapshot every K steps inside an epoch (0: only at epoch ends)")
    parser.add_argument("--crash-at-step", type=nonnegative_int, default=0,
                        help="fault drill: rank 1 kills itself after this global step, once per run")
    args = parser.parse_args(argv)
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
