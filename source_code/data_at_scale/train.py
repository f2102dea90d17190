"""Training from staged shards with the global cursor: stop on one world size, resume on another,
every sample of every epoch trained exactly once (the Slurm job of notebook 20).

    python -m source_code.data_at_scale.train                      # one process, shards of its own
    torchrun --standalone --nproc-per-node=2 -m source_code.data_at_scale.train
    torchrun ... -m source_code.data_at_scale.train --shards DIR --stage-dir '/tmp/x-{node}' \\
        --checkpoint snap.pt --stop-after-steps 9              # then again with --resume on fewer ranks
    torchrun ... --checkpoint snap.pt --resume --hold-after-steps 9   # the requeue drill (below)

Each rank reads its node's staged copy of the shards (staging.py made it, one task per node;
``{node}`` in ``--stage-dir`` is the node's name) into memory by sample id, and trains the
global cursor's batches (loops.train_from_cursor): the global batch ``--global-batch`` is kept
on any world size, each rank taking its slice. ``--stop-after-steps K`` stops after K steps
with a snapshot holding the model, the optimizer and the cursor (as a job stopped by its time
limit does, notebook 07); ``--resume`` continues from it on whatever world this launch has.
``--hold-after-steps K`` is the requeue drill's (slurm/data_at_scale_requeue.slurm): on the
job's first run only (SLURM_RESTART_COUNT 0) it saves the same snapshot after K steps, writes
``<checkpoint>.held`` and then waits, doing nothing, until the job is killed; the requeued run
(with ``--resume``) trains on from the snapshot. The kill so comes while the epoch is in progress
on a machine of any speed: the job waits for the file, not for a length of training.
Every step's ids go to ``--log-dir`` (one file per rank and launch); when the last epoch ends,
rank 0 reads every launch's logs and counts, per epoch, the samples trained twice and never.
Without ``--shards`` each node writes the shards of the sort task into a directory of its own.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from source_code import checkpoint
from source_code.cli import Parser, nonnegative_int, positive_int, writable_path
from source_code.distributed import print0, run_main, session
from source_code.errors import LaunchError
from source_code.data_at_scale import cursor as cur, formats, loops, model as mdl, staging
from source_code.launch import faults

LAUNCH = "torchrun --standalone --nproc-per-node=2 -m source_code.data_at_scale.train"


def default_dirs(args) -> None:
    """Without --shards: the sort task's shards go in a directory of this node (see main)."""
    base = Path(tempfile.gettempdir()) / f"data-at-scale-{os.environ.get('MASTER_PORT', os.getpid())}"
    args.stage_dir = args.stage_dir or str(base / "stage-{node}")
    args.log_dir = args.log_dir or str(base / "logs")
    args.generate = args.shards is None           # written by each node's local rank 0 (main)
    if args.generate:
        args.shards = str(base / "shards")


def load_samples(stage_dir: str):
    names = staging.staged(stage_dir)
    if names is None:
        raise LaunchError(f"error: no complete staged copy in {stage_dir}; stage the shards first, one task "
                          "per node: srun --ntasks-per-node=1 python -m source_code.data_at_scale.staging "
                          "--from SHARDS --to DIR", every_rank=True)
    return formats.as_array(formats.load_shards([os.path.join(stage_dir, n) for n in names]))


def history(log_dir: str) -> dict:
    """Per epoch, from every launch's step logs: samples trained, twice, never; equal steps per rank."""
    epochs, steps = {}, {}
    for path in sorted(Path(log_dir).glob("*.jsonl")):
        launch = path.name.split("-rank")[0]
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            epochs.setdefault(rec["epoch"], []).extend(rec["ids"])
            steps.setdefault(launch, {}).setdefault(path.name, 0)
            steps[launch][path.name] += 1
    equal = all(len(set(per_rank.values())) == 1 for per_rank in steps.values())
    return {"epochs": epochs, "launches": len(steps), "steps_equal": equal}


def run(me, args) -> dict:
    samples = load_samples(staging.node_dir(args.stage_dir))
    model = mdl.build(dim=args.dim, seed=args.seed, device=me.device)
    model = DDP(model, device_ids=[me.device.index] if me.device.type == "cuda" else None)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    cursor = cur.GlobalCursor(len(samples), args.global_batch, args.seed)
    written_by = me.world_size
    resumed = args.resume and args.checkpoint and os.path.exists(args.checkpoint)
    if resumed:
        extra = checkpoint.load_snapshot(args.checkpoint, model, opt)["extra"]
        cursor.load_state_dict(extra["cursor"])
        written_by = extra["world"]
        print0(f"resumed: world_size={me.world_size} from a snapshot of world_size={written_by} at epoch "
               f"{cursor.epoch + 1}, sample {cursor.consumed} of {cursor.n}")
    start = cursor.state_dict()
    log = Path(args.log_dir) / f"e{start['epoch']}s{start['consumed']}w{me.world_size}-rank{me.rank}.jsonl"
    if me.rank == 0:
        log.parent.mkdir(parents=True, exist_ok=True)
        for old in log.parent.glob("*.jsonl") if not resumed else ():   # a fresh start: no history yet
            old.unlink()
    dist.barrier()
    log.unlink(missing_ok=True)                    # the same launch again (a requeue) logs afresh

    def on_step(ids):
        with log.open("a") as f:
            f.write(json.dumps({"epoch": cursor.epoch, "ids": [i for i in ids if i != cur.PAD]}) + "\n")
    left = args.stop_after_steps or args.hold_after_steps or None
    while cursor.epoch < args.epochs and left != 0:
        epoch = cursor.epoch
        done = loops.train_from_cursor(model, opt, cursor, samples, me.rank, me.world_size, left,
                                       on_step, device=me.device)
        left = None if left is None else left - done
        if cursor.epoch > epoch:
            print0(f"epoch {epoch + 1}/{args.epochs} done on world_size={me.world_size}")
    if args.checkpoint:
        checkpoint.save_snapshot(args.checkpoint, model, opt, cursor.epoch,
                                 extra={"cursor": cursor.state_dict(), "world": me.world_size})
    return {"start": start, "end": cursor.state_dict(), "written_by": written_by,
            "finished": cursor.epoch >= args.epochs, "n": cursor.n}


def hold(me, args, r) -> None:
    """The drill's first run: the snapshot and every log are written; say so, then wait to be killed."""
    if me.rank == 0:
        print(f"holding: world_size={me.world_size} after {r['end']['consumed']} of {r['n']} samples of "
              f"epoch {r['end']['epoch'] + 1}, snapshot {args.checkpoint}; this run waits until the job "
              "kills it", flush=True)
        Path(args.checkpoint + ".held").write_text(json.dumps(r["end"]) + "\n")
    while True:
        time.sleep(1)


def main(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--shards", help="the shards on the shared file system (default: written per node)")
    p.add_argument("--stage-dir", help="this node's staged copy; {node} becomes the node's name")
    p.add_argument("--checkpoint", type=writable_path, default="", help="snapshot path (shared storage)")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint when it exists")
    p.add_argument("--stop-after-steps", type=nonnegative_int, default=0, help="stop with a snapshot (0: never)")
    p.add_argument("--hold-after-steps", type=nonnegative_int, default=0,
                   help="first run of a job only: snapshot after this many steps, then wait to be killed")
    p.add_argument("--epochs", type=positive_int, default=1)
    p.add_argument("--global-batch", type=positive_int, default=48, help="kept on every world size")
    p.add_argument("--log-dir", help="step logs (shared storage; default beside the shards)")
    p.add_argument("--samples", type=positive_int, default=1210, help="without --shards: samples to write")
    p.add_argument("--per-shard", type=positive_int, default=128, help="without --shards: samples per shard")
    p.add_argument("--dim", type=positive_int, default=16)
    p.add_argument("--seed", type=nonnegative_int, default=0)
    args = p.parse_args(argv)
    world = int(os.environ.get("WORLD_SIZE", 1))
    if args.global_batch % world:
        raise LaunchError(f"error: --global-batch {args.global_batch} does not split over {world} processes; "
                          f"pick a multiple of {world}")
    if args.hold_after_steps and not (args.checkpoint and args.resume):
        raise LaunchError("error: --hold-after-steps needs --checkpoint and --resume: the requeued run "
                          "resumes from the snapshot it leaves")
    if not faults.first_attempt():
        args.hold_after_steps = 0                  # the requeued run trains on to the end
    default_dirs(args)
    code = 0
    with session(launch_hint=LAUNCH, allow_single=True) as me:
        if me.local_rank == 0 and args.generate and not formats.shard_urls(args.shards):
            formats.write_shards(formats.make_samples(args.samples), Path(args.shards).parent, args.per_shard)
        if me.local_rank == 0 and staging.staged(staging.node_dir(args.stage_dir)) is None:
            staging.stage(args.shards, staging.node_dir(args.stage_dir))   # the job script stages in a step of its own
        dist.barrier()
        r = run(me, args)
        dist.barrier()                             # every rank's log is complete
        if args.hold_after_steps and not r["finished"]:
            hold(me, args, r)
        if r["finished"] and me.rank == 0:
            h = history(args.log_dir)
            counts = [(len(ids) - len(set(ids)), r["n"] - len(set(ids))) for ids in h["epochs"].values()]
            print(f"summary: world_size={me.world_size} resumed_from_world={r['written_by']} "
                  f"resumed_at={r['start']['consumed']} epochs={len(h['epochs'])} samples={r['n']} "
                  f"launches={h['launches']} repeated={sum(c[0] for c in counts)} "
                  f"missing={sum(c[1] for c in counts)} steps_equal={int(h['steps_equal'])}", flush=True)
            exact = h["steps_equal"] and not any(a or b for a, b in counts)
            if not exact:                          # the job fails: its history is not exactly once
                print("error: not every sample of every epoch was trained exactly once on equal steps "
                      "(the summary above counts them)", flush=True)
                code = 1
        elif me.rank == 0:
            print(f"stopped: world_size={me.world_size} after {r['end']['consumed']} of {r['n']} samples of "
                  f"epoch {r['end']['epoch'] + 1}, snapshot {args.checkpoint or '(none: no --checkpoint)'}")
            print(f"summary: world_size={me.world_size} stopped_at={r['end']['consumed']} "
                  f"epoch={r['end']['epoch']} samples={r['n']}", flush=True)
    return code


if __name__ == "__main__":
    run_main(main)
