"""The plain DDP training of source_code/training/ddp.py, written for DeepSpeed ZeRO.

    torchrun --standalone --nproc-per-node=2 -m source_code.frameworks.deepspeed_train --zero-stage 1
    torchrun --standalone --nproc-per-node=2 -m source_code.frameworks.deepspeed_train --zero-stage 3
    deepspeed --num_gpus 4 --module source_code.frameworks.deepspeed_train --zero-stage 2   # its own launcher

The ZeRO settings come from deepspeed_zero.json next to this file (--config another one);
--zero-stage and --batch-size override its stage and train_batch_size. ZeRO-1 shards the
optimizer state, ZeRO-2 also the gradients, ZeRO-3 also the parameters. On CPU DeepSpeed picks
gloo by itself. The optimizer is the plain script's torch SGD (a config "optimizer" entry of
type Adam would JIT-compile DeepSpeed's fused Adam kernel, minutes on a CPU). DeepSpeed's own
launcher appends --local_rank=N to the arguments: accepted and ignored (LOCAL_RANK is set too).
"""
from __future__ import annotations

import argparse
import json
import os

import torch
import torch.nn.functional as F

from source_code.distributed import all_reduce_mean, print0, run_main
from source_code.errors import LaunchError
from source_code.frameworks import common
from source_code.training import loop

LAUNCH = "torchrun --standalone --nproc-per-node=2 -m source_code.frameworks.deepspeed_train"
CONFIG = os.path.join(os.path.dirname(__file__), "deepspeed_zero.json")


def load_config(args) -> dict:
    """The JSON file, with the stage and global batch of the command line put in."""
    try:
        with open(args.config) as f:
            config = json.load(f)
    except (OSError, ValueError) as exc:
        raise LaunchError(f"error: --config {args.config} is not a readable JSON file ({exc}); "
                          f"start from {CONFIG}") from None
    config.setdefault("zero_optimization", {})["stage"] = args.zero_stage
    config["train_batch_size"] = args.batch_size  # DeepSpeed derives B/N per rank from it
    config.pop("train_micro_batch_size_per_gpu", None)
    return config


def skip_shm_comm_op(deepspeed) -> None:
    """On CPU DeepSpeed compiles a shared-memory all-reduce kernel when its communication
    backend starts (g++ and ninja, 25-90 s the first time, then cached in TORCH_EXTENSIONS_DIR).
    Only its inference all-reduce uses that kernel; training goes through torch.distributed.
    Marking the op incompatible (DeepSpeed's own table of ops) keeps every launch build-free."""
    if "deepspeed_shm_comm" in deepspeed.ops.__compatible_ops__:
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def train(args, job) -> dict:
    if job.device_type == "cpu":  # said here, DeepSpeed does not warn that it found no GPU
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed
    common.quiet(job.rank)
    if job.device_type == "cpu":
        skip_shm_comm_op(deepspeed)
    train_set, test_loader = common.datasets(args)
    model, optimizer = loop.build(args, "cpu")  # same seed, same weights; DeepSpeed places it
    # the engine wraps model + optimizer: ZeRO partitions optimizer state / gradients / parameters
    engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer,
                                                   config=load_config(args))
    loader = common.sharded_loader(train_set, args, job.rank, job.world_size, engine.device.type)
    common.say(job, f"deepspeed ZeRO-{args.zero_stage}: {len(train_set)} examples, world_size="
                    f"{job.world_size}, launched by {job.launcher}")
    timer, losses = loop.Timer(), []
    for epoch in range(args.epochs):
        loader.sampler.set_epoch(epoch)
        losses = []
        for x, y in loader:
            x, y = x.to(engine.device), y.to(engine.device)
            loss = F.cross_entropy(engine(x), y)
            engine.backward(loss)  # reduce(-scatter)s the gradients into each rank's partition
            engine.step()          # each rank updates its partition, then parameters are shared
            losses.append(loss.item())
            if args.max_steps and len(losses) >= args.max_steps:
                break
    seconds = timer.seconds
    loss = all_reduce_mean(sum(losses) / max(len(losses), 1))
    # every rank evaluates: under ZeRO-3 each forward gathers the parameters it needs
    accuracy = loop.evaluate(engine, test_loader, engine.device)
    if args.save_weights:
        params = list(engine.module.parameters())
        with deepspeed.zero.GatheredParameters(params):  # no-op below ZeRO-3
            state = common.full_state_dict(engine.module)
        if job.rank == 0:
            torch.save(state, args.save_weights)
    print0(common.summary(job.world_size, args.epochs, accuracy, seconds, engine.global_steps, loss,
                          engine.device))
    engine.destroy()
    return {"accuracy": accuracy}


def main(argv=None):
    parser = common.parser(__doc__)
    parser.add_argument("--zero-stage", type=int, choices=(0, 1, 2, 3), default=2)
    parser.add_argument("--config", default=CONFIG, help="DeepSpeed JSON config (ZeRO settings)")
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None,
                        help=argparse.SUPPRESS)  # appended by the deepspeed launcher
    args = parser.parse_args(argv)
    common.check(args)
    job = common.Job()
    job.check_batch(args.batch_size)
    load_config(args)  # a bad file fails here, before any process group
    return common.run(train, args, job)


if __name__ == "__main__":
    run_main(main)
