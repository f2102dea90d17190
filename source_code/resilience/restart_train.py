"""The classic answer to a failure, measured: torchrun restarts every worker, they resume from a snapshot.

    torchrun --standalone --nproc-per-node=2 --max-restarts=1 -m source_code.resilience.restart_train \\
        --steps 40 --snapshot-every 8 --kill-at-step 10 --checkpoint /tmp/restart/snap.pt --log-dir /tmp/restart

The same model, data and batches as the per-step fault-tolerant run (common.py), in plain DDP:
a snapshot every K steps (checkpoint.save_snapshot, notebook 07); on the first attempt rank 1
SIGKILLs itself inside its gradient all-reduce once N steps are done (resilience/faults.py), so
the step in flight is lost as well; torchrun stops the other rank and starts both again
(--max-restarts, as above and as compare.py runs it; a Slurm requeue would instead start a new
job, which --attempt 1 --kill-at-step 0 stands for); they read the snapshot and redo the steps
since it. Every rank
logs each finished step, the snapshot's cost and the resume with the wall-clock time, rank 0
the eval loss after every step (recovery.py reads them).
"""
from __future__ import annotations

import os
import time

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from source_code import checkpoint, workload
from source_code.cli import Parser, nonnegative_int, positive_int, writable_path
from source_code.distributed import print0, run_main, session
from source_code.launch import faults
from source_code.resilience import common
from source_code.resilience import faults as resilience_faults

LAUNCH = ("torchrun --standalone --nproc-per-node=2 --max-restarts=1 "
          "-m source_code.resilience.restart_train")


def train(me, args) -> None:
    attempt = args.attempt if args.attempt is not None else int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    log = common.StepLog(os.path.join(args.log_dir, f"rank_{me.rank}.jsonl") if args.log_dir else "")
    dataset = common.task()
    log.write(event="start", attempt=attempt)
    model, optimizer = common.build(args.seed)
    start = 0
    if os.path.exists(args.checkpoint):
        t0 = time.time()
        start = checkpoint.load_snapshot(args.checkpoint, model, optimizer)["extra"]["step"]
        log.write(event="resume", attempt=attempt, step=start, seconds=time.time() - t0)
        print0(f"attempt {attempt}: resumed from the snapshot of step {start}")
    ddp = DDP(model)
    finished = [start]
    victim = args.kill_at_step and faults.first_attempt() and me.rank == min(1, me.world_size - 1)
    # the whole global batch of the step in flight is computed for nothing
    resilience_faults.die_in_ddp_allreduce(ddp, lambda: finished[0], args.kill_at_step if victim else None,
                                           log, samples=args.batch_size, rank=me.rank)
    per_rank = args.batch_size // me.world_size
    for step in range(start, args.steps):
        begun = time.time()
        x, y = common.part_batch(dataset, step, args.batch_size, me.world_size, me.rank)
        optimizer.zero_grad()
        loss = workload.loss_fn(ddp, x, y)
        loss.backward()
        optimizer.step()
        finished[0] = step + 1
        log.write(event="step", attempt=attempt, step=finished[0], begun=begun, samples=per_rank,
                  loss=loss.item())
        if me.rank == 0 and finished[0] % args.eval_every == 0:
            log.write(event="eval", step=finished[0], eval_loss=common.eval_loss(model, dataset))
        time.sleep(max(0.0, args.step_seconds - (time.time() - begun)))  # a bigger model's compute
        if args.snapshot_every and finished[0] % args.snapshot_every == 0:
            t0 = time.time()
            checkpoint.save_snapshot(args.checkpoint, model, optimizer, epoch=0, extra={"step": finished[0]})
            log.write(event="snapshot", step=finished[0], seconds=time.time() - t0)
    if me.rank == 0:
        log.write(event="end", step=args.steps, digest=common.digest(model, optimizer),
                  eval_loss=common.eval_loss(model, dataset))
    print0(f"attempt {attempt}: finished step {args.steps}")


def main(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=positive_int, default=40)
    p.add_argument("--batch-size", type=positive_int, default=32, help="global batch")
    p.add_argument("--snapshot-every", type=positive_int, default=8)
    p.add_argument("--kill-at-step", type=nonnegative_int, default=10)
    p.add_argument("--step-seconds", type=float, default=0.05)
    p.add_argument("--checkpoint", type=writable_path, default="restart_snapshot.pt")
    p.add_argument("--log-dir", default="")
    p.add_argument("--eval-every", type=positive_int, default=1,
                   help="rank 0 logs the eval loss every N steps (inside the step's --step-seconds)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--attempt", type=nonnegative_int, default=None,
                   help="the attempt number to log (default: torchrun's restart count)")
    args = p.parse_args(argv)
    if args.step_seconds < 0:
        p.error("--step-seconds must be >= 0")
    if args.kill_at_step >= args.steps:
        p.error(f"--kill-at-step {args.kill_at_step} must be below --steps {args.steps}")
    if args.log_dir:
        os.makedirs(args.log_dir, exist_ok=True)
    torch.set_num_threads(1)
    with session(LAUNCH, seed=args.seed) as me:
        if args.batch_size % me.world_size:
            p.error(f"--batch-size {args.batch_size} must divide by the {me.world_size} processes")
        train(me, args)
    return 0


if __name__ == "__main__":
    run_main(main)
