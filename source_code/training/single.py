"""Single-process training: the baseline that ddp.py turns into data-parallel training.

    python -m source_code.training.single
    python -m source_code.training.single --epochs 2 --batch-size 128

Same flags, same loop and the same summary line as ddp.py (with world_size=1). The lines that
ddp.py adds or changes are marked (1)-(6) there; notebook 05 shows the difference of the two
train() functions, so keep their shapes parallel.
"""
from __future__ import annotations

import os

import torch
from torch.utils.data import DataLoader

from source_code import checkpoint, data
from source_code.cli import Parser
from source_code.distributed import pick_device, run_main, seed_everything
from source_code.training import loop


def train(device, args) -> dict:
    batch = args.batch_size
    train_set = data.load(args.dataset, "train", args.data_dir)
    generator = torch.Generator().manual_seed(args.seed)
    loader = DataLoader(train_set, batch_size=batch, shuffle=True, generator=generator,
                        pin_memory=device.type == "cuda")
    test_loader = DataLoader(data.load(args.dataset, "test", args.data_dir), batch_size=256)

    model, opt = loop.build(args, device)
    start_epoch = 0
    if args.resume and os.path.exists(args.checkpoint):
        start_epoch = checkpoint.load_snapshot(args.checkpoint, model, opt)["epoch"]
        print(f"resumed from {args.checkpoint} after epoch {start_epoch}")
    elif args.resume:
        print(f"no snapshot at {args.checkpoint} yet: starting from scratch")

    timer, accuracy = loop.Timer(), 0.0
    print(f"training {args.model} on {args.dataset}: {len(train_set)} examples, world_size=1, "
          f"batch {batch}, on {device.type}")
    losses = []
    for epoch in range(start_epoch, args.epochs):
        loss, steps = loop.train_epoch(model, loader, opt, device, args.max_steps)
        losses.append(loss)
        accuracy = loop.evaluate(model, test_loader, device)
        print(f"epoch {epoch + 1:3d}/{args.epochs}  loss {loss:.4f}  held-out accuracy "
              f"{accuracy:.4f}  steps {steps}  {timer.seconds:6.1f}s")
        if args.checkpoint:
            checkpoint.save_snapshot(args.checkpoint, model, opt, epoch + 1)
    if start_epoch >= args.epochs:
        accuracy = loop.evaluate(model, test_loader, device)
    print(loop.summary_line(1, args.epochs, accuracy, timer.seconds, losses))
    return {"accuracy": accuracy}


def main(argv=None):
    args = loop.add_common_args(Parser(description=__doc__.splitlines()[0])).parse_args(argv)
    loop.check_args(args)
    seed_everything(args.seed)
    device, _ = pick_device(0)  # cuda:0 where there is a GPU, else the CPU
    train(device, args)
    return 0


if __name__ == "__main__":
    run_main(main)
