"""The worker of an elastic job: whatever world torchrun gives it, it resumes from the last DCP checkpoint.

    torchrun --nnodes=1:2 --nproc-per-node=1 --max-restarts=3 --rdzv-backend=c10d \\
        --rdzv-endpoint=HOST:29400 --rdzv-id=job1 -m source_code.resilience.elastic_train \\
        --checkpoint-dir /shared/elastic --log-dir /shared/elastic/logs

(on every node; ``python -m source_code.resilience.elastic`` starts such agents on one machine,
kills one and adds one.) torchrun starts this script again, on every node, each time the
membership changes: a node lost (a worker fails, the agent restarts its workers, the
rendezvous completes without the dead node) or a node joining (the healthy workers are stopped
and started again in a larger world). So the script knows nothing of what happened before
except what is on disk: one DCP checkpoint after every step (model, Adam state and the epoch's
global data position, reshard.py), re-laid out for the new world size on load.

The learning-rate choice: the *global* batch is kept (``--batch-size``, split over the world),
so every step sees the same samples whatever the world size and the learning rate stays
right; each rank's slice grows when the world shrinks (its memory must allow it).
Every step is logged (rank, world, attempt, samples) for the harness to count.
"""
from __future__ import annotations

import os
import socket
import time

import torch
import torch.distributed as dist

from source_code.cli import Parser, positive_int, writable_path
from source_code.distributed import print0, run_main, session
from source_code.resilience import common, faults, reshard

LAUNCH = ("torchrun --nnodes=1:2 --nproc-per-node=1 --rdzv-backend=c10d --rdzv-endpoint=HOST:PORT "
          "-m source_code.resilience.elastic_train")
LATEST = "latest"        # a file naming the last complete checkpoint directory


def latest_checkpoint(directory: str) -> str | None:
    try:
        with open(os.path.join(directory, LATEST)) as f:
            return os.path.join(directory, f.read().strip())
    except FileNotFoundError:
        return None


def mark_latest(directory: str, name: str) -> None:
    """Point at ``name`` atomically: a kill leaves the old pointer or the new one, never half."""
    tmp = os.path.join(directory, f".{LATEST}.{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(name)
    os.replace(tmp, os.path.join(directory, LATEST))


def drill_faults(args, me, consumed: int, name: str | None) -> None:
    """The elastic drill's faults, at a step boundary once checkpoint ``name`` is the latest:
    ``--die-at N``: in its first world this node dies (its agent and its worker) at the first
    boundary at or past N samples; ``--hold-at N,M``: a world of one worker waits at sample N
    (0: before its first step) until torchrun restarts it because a node has joined."""
    if 0 <= args.die_at <= consumed and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
        while name and latest_checkpoint(args.checkpoint_dir) != os.path.join(args.checkpoint_dir, name):
            time.sleep(0.01)                       # rank 0 marks it: the kill lands after that
        faults.die_with_agent()
    if consumed in args.hold_at and me.world_size == 1:
        print0(f"world 1: waiting at sample {consumed} for a node to join")
        faults.hold_until_restarted("node joining the job")


def train(me, args) -> None:
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    log = common.StepLog(os.path.join(args.log_dir, f"worker_{os.getpid()}.jsonl"))
    dataset = common.task(args.samples)
    model, optimizer = common.build(0)
    position = reshard.EpochPosition(len(dataset), args.batch_size)
    found = latest_checkpoint(args.checkpoint_dir)
    if found:
        reshard.load(found, model, optimizer, position)           # any world size -> this one
        # the drill: a world of one that resumes where it must wait waits there too (a joining
        # node whose round closed before the held worker's agent came back to the rendezvous)
        if position.consumed in args.hold_at and me.world_size == 1:
            drill_faults(args, me, position.consumed, None)
    else:
        drill_faults(args, me, 0, None)                           # the drill: wait for a partner
    resumed_at, port = position.consumed, int(os.environ["MASTER_PORT"])    # port: new every round
    log.write(event="start", rank=me.rank, world=me.world_size, master_port=port, attempt=attempt,
              pid=os.getpid(), agent=os.getppid(), host=socket.gethostname(), resumed_at=resumed_at)
    print0(f"world {me.world_size} (restart count {attempt}): "
           + (f"resumed at sample {position.consumed} from {os.path.basename(found)}" if found else "started"))
    total = len(dataset) // args.batch_size * args.batch_size
    while position.consumed < total:
        begun = time.time()
        idx = reshard.train_step(model, optimizer, position, dataset)
        # a bigger model's compute: in proportion to this rank's slice (fewer workers, slower steps)
        time.sleep(max(0.0, args.sample_seconds * len(idx) - (time.time() - begun)))
        log.write(event="step", rank=me.rank, world=me.world_size, master_port=port,
                  consumed=position.consumed, samples=idx)
        name = f"step_{position.consumed:06d}"
        reshard.save(os.path.join(args.checkpoint_dir, name), model, optimizer, position)
        if me.rank == 0:
            mark_latest(args.checkpoint_dir, name)
        drill_faults(args, me, position.consumed, name)
    if me.rank == 0:
        log.write(event="end", world=me.world_size, consumed=position.consumed, samples=len(dataset),
                  batch_size=args.batch_size,
                  digest=common.digest(model), eval_loss=common.eval_loss(model, dataset))
    print0(f"world {me.world_size}: epoch done ({position.consumed} samples)")


def _samples(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


def main(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint-dir", type=writable_path, required=True, help="shared by every node")
    p.add_argument("--log-dir", type=writable_path, required=True)
    p.add_argument("--samples", type=positive_int, default=240, help="samples in the epoch")
    p.add_argument("--batch-size", type=positive_int, default=8, help="global batch, kept on any world")
    p.add_argument("--sample-seconds", type=float, default=0.025,
                   help="the shortest compute time per sample on a rank (a bigger model's)")
    p.add_argument("--die-at", type=int, default=-1, help="drill: this node dies after this many samples")
    p.add_argument("--hold-at", type=_samples, default=(),
                   help="drill: a world of 1 waits at these sample counts (e.g. 0,40) until a node joins")
    args = p.parse_args(argv)
    if not args.sample_seconds >= 0:
        p.error("--sample-seconds must be >= 0")
    if args.batch_size > args.samples:
        p.error(f"--batch-size {args.batch_size} must not exceed --samples {args.samples}")
    os.makedirs(args.checkpoint_dir, exist_ok=True)
    os.makedirs(args.log_dir, exist_ok=True)
    torch.set_num_threads(1)
    with session(LAUNCH, seed=0) as me:
        if args.batch_size % me.world_size:
            p.error(f"--batch-size {args.batch_size} must divide by the world size {me.world_size}")
        train(me, args)
    return 0


if __name__ == "__main__":
    run_main(main)
