"""The plain DDP training of source_code/training/ddp.py, written for Hugging Face Accelerate.

    torchrun --standalone --nproc-per-node=2 -m source_code.frameworks.accelerate_train
    torchrun --standalone --nproc-per-node=2 -m source_code.frameworks.accelerate_train --batches sampler
    accelerate launch --config_file source_code/frameworks/accelerate_fsdp2.yaml \\
        -m source_code.frameworks.accelerate_train          # GPUs: FSDP2 from the YAML file

The loop stays the user's; Accelerate moves model and batches to the device, wraps the model
(DDP, or FSDP2 with the YAML file), shards the data loader, and accelerator.backward(loss)
applies whatever the wrapping needs (loss scaling, DeepSpeed's backward).

Accelerate shards the loader its own way (batches.py says how): other batches than the plain
script's DistributedSampler, so other weights. ``--batches sampler`` hands it the plain
script's per-rank loader instead, left unprepared: then the weights equal the plain script's
up to rounding, which shows that the batches are the only difference.

The trap: on a machine without GPUs, `Accelerator()` under torchrun gives N processes that each
train alone as "process 0 of 1", and `accelerate launch --cpu --num_processes 2` starts ONE
process: no error either way. Here `--cpu auto` follows the device policy (cpu=True without
GPUs) and the script compares the launcher's world size (or --expect-processes) with what
Accelerate sees: a mismatch is one line and exit status 2, before any training.
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from source_code.cli import positive_int
from source_code.distributed import all_reduce_mean, print0, run_main
from source_code.errors import LaunchError
from source_code.frameworks import common
from source_code.training import loop

LAUNCH = "torchrun --standalone --nproc-per-node=2 -m source_code.frameworks.accelerate_train"
FSDP2_CONFIG = os.path.join(os.path.dirname(__file__), "accelerate_fsdp2.yaml")


def check_world(accelerator, expected: int) -> None:
    """Fail loudly when Accelerate sees fewer processes than were started (or asked for)."""
    if expected > 1 and accelerator.num_processes != expected:
        raise LaunchError(
            f"error: {expected} processes were asked for but Accelerate sees "
            f"{accelerator.num_processes}: on a machine without GPUs create Accelerator(cpu=True) "
            f"(or export ACCELERATE_USE_CPU=true) and start the processes with torchrun "
            f"({LAUNCH})", every_rank=False)


def train(args, job) -> dict:
    from accelerate import Accelerator
    common.quiet(job.rank)
    use_cpu = job.device_type == "cpu" if args.cpu == "auto" else args.cpu == "yes"
    accelerator = Accelerator(cpu=use_cpu)
    check_world(accelerator, args.expect_processes or job.world_size)
    train_set, test_loader = common.datasets(args)
    model, optimizer = loop.build(args, "cpu")  # same seed, same weights as the plain script
    if args.batches == "sampler":  # the plain script's loader, unprepared: exactly its batches
        loader = common.sharded_loader(train_set, args, job.rank, job.world_size, accelerator.device)
        model, optimizer = accelerator.prepare(model, optimizer)
    else:
        loader = DataLoader(train_set, batch_size=loop.per_rank_batch(args.batch_size, job.world_size),
                            shuffle=True, generator=torch.Generator().manual_seed(args.seed))
        # device placement, DDP/FSDP wrapping, a shard of every epoch's batches per process
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    print0(f"accelerate ({accelerator.distributed_type.value}): {len(train_set)} examples, "
           f"world_size={accelerator.num_processes}, launched by {job.launcher}")
    timer, losses, steps = loop.Timer(), [], 0
    for epoch in range(args.epochs):
        model.train()
        losses = []
        if args.batches == "sampler":
            loader.sampler.set_epoch(epoch)
        for x, y in loader:  # a prepared loader put them on accelerator.device already
            x, y = x.to(accelerator.device), y.to(accelerator.device)
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            accelerator.backward(loss)  # instead of loss.backward()
            optimizer.step()
            losses.append(loss.item())
            steps += 1
            if args.max_steps and len(losses) >= args.max_steps:
                break
    seconds = timer.seconds
    loss = all_reduce_mean(sum(losses) / max(len(losses), 1))
    accuracy = loop.evaluate(model, test_loader, accelerator.device)  # every rank (FSDP-safe)
    if args.save_weights:
        state = common.full_state_dict(accelerator.unwrap_model(model))
        if accelerator.is_main_process:
            torch.save(state, args.save_weights)
    print0(common.summary(accelerator.num_processes, args.epochs, accuracy, seconds, steps, loss,
                          accelerator.device))
    return {"accuracy": accuracy}


def main(argv=None):
    parser = common.parser(__doc__)
    parser.add_argument("--cpu", choices=("auto", "yes", "no"), default="auto",
                        help="Accelerator(cpu=...): auto follows the device policy (no GPU: yes)")
    parser.add_argument("--batches", choices=("accelerate", "sampler"), default="accelerate",
                        help="accelerate: a shuffled loader sharded by prepare(); sampler: the plain "
                             "script's DistributedSampler loader, not prepared (its exact batches)")
    parser.add_argument("--expect-processes", type=positive_int, default=None,
                        help="fail unless Accelerate sees this many processes (default: the "
                             "launcher's WORLD_SIZE)")
    args = parser.parse_args(argv)
    common.check(args)
    job = common.Job()
    job.check_batch(args.batch_size)
    return common.run(train, args, job)


if __name__ == "__main__":
    run_main(main)
