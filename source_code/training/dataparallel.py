"""nn.DataParallel training: one process, one thread per GPU (the design DDP replaced).

    python -m source_code.training.dataparallel
    python -m source_code.training.dataparallel --epochs 2 --batch-size 256

How DataParallel works, in every forward() call:

1. scatter: the batch on the first GPU (device_ids[0]) is cut into one chunk per GPU;
2. replicate: the module's parameters and buffers are copied from the first GPU to all others
   (again at every step: the replicas are thrown away after the step);
3. parallel_apply: one Python thread per GPU runs its replica's forward on its chunk;
4. gather: the outputs are copied back to the first GPU (output_device) and concatenated.
   backward() then runs through the same graph in reverse, and the gradients of all replicas
   are summed into the original parameters on the first GPU; the optimizer steps there.

Its bottlenecks: a single Python process drives every GPU, so the threads contend for the GIL;
the first GPU holds the inputs, the gathered outputs, the loss and the summed gradients, so its
memory and its copies limit the whole job; the model is re-broadcast every step; and it cannot
span more than one machine. DistributedDataParallel (ddp.py) runs one process per GPU instead:
no GIL sharing, no replication per step (each process keeps its own copy, kept equal by an
all-reduce of the gradients that overlaps backward), and it works across nodes.

Without GPUs DataParallel does nothing: device_ids becomes [] and forward() calls the module
once on the full batch (device_ids like ["cpu", "cpu"] are ignored). This script says so in one
line; with 2 or more GPUs it really splits each batch across them.
"""
from __future__ import annotations

import threading

import torch
from torch.utils.data import DataLoader

from source_code import data
from source_code.cli import Parser
from source_code.errors import LaunchError
from source_code.distributed import pick_device, run_main, seed_everything
from source_code.training import loop


def describe(dp: torch.nn.DataParallel) -> str:
    """One line saying what this DataParallel wrapper really does on this machine."""
    ids = list(dp.device_ids)
    if len(ids) < 2:
        why = "no GPU" if not ids else "only 1 GPU"
        return (f"DataParallel: {why} -> falls back to one device (device_ids={ids}): the module "
                f"runs once on the full batch, nothing is split")
    return (f"DataParallel: splitting each batch across {len(ids)} GPUs {ids}, gathering on "
            f"cuda:{dp.output_device}")


def forward_by_hand(module: torch.nn.Module, x: torch.Tensor, n_devices: int) -> torch.Tensor:
    """DataParallel's forward written out, with one thread per "device" on one device.

    On GPUs step 2 copies the weights to every GPU and each thread runs on its own GPU; here
    the replicas are the module itself, so the arithmetic is DataParallel's while the
    hardware is not. Autograd records through the threads: backward() sums the chunks'
    gradients into the module's parameters, as DataParallel does on the first GPU.
    """
    chunks = x.chunk(n_devices)                  # 1. scatter: one slice of the batch per device
    replicas = [module] * len(chunks)            # 2. replicate: here the module itself (on GPUs a copy per device)
    outputs = [None] * len(chunks)

    def run(i):
        outputs[i] = replicas[i](chunks[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(chunks))]
    for t in threads:                            # 3. parallel_apply: one Python thread each
        t.start()
    for t in threads:
        t.join()
    return torch.cat(outputs)                    # 4. gather: outputs back on the first device


def train(device, args) -> dict:
    train_set = data.load(args.dataset, "train", args.data_dir)
    generator = torch.Generator().manual_seed(args.seed)
    loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True, generator=generator)
    test_loader = DataLoader(data.load(args.dataset, "test", args.data_dir), batch_size=256)

    model, opt = loop.build(args, device)
    # the only change from single.py: wrap the model (all visible GPUs by default)
    dp = torch.nn.DataParallel(model)
    print(describe(dp))

    timer, accuracy = loop.Timer(), 0.0
    losses = []
    for epoch in range(args.epochs):
        loss, steps = loop.train_epoch(dp, loader, opt, device, args.max_steps)
        losses.append(loss)
        accuracy = loop.evaluate(dp.module, test_loader, device)
        print(f"epoch {epoch + 1:3d}/{args.epochs}  loss {loss:.4f}  held-out accuracy "
              f"{accuracy:.4f}  steps {steps}  {timer.seconds:6.1f}s")
    print(loop.summary_line(1, args.epochs, accuracy, timer.seconds, losses))
    return {"accuracy": accuracy, "device_ids": list(dp.device_ids)}


def main(argv=None):
    parser = loop.add_common_args(Parser(description=__doc__.splitlines()[0]))
    args = parser.parse_args(argv)
    loop.check_args(args)
    if args.checkpoint or args.resume:
        raise LaunchError("error: dataparallel.py does not write snapshots; drop --checkpoint/--resume "
                         "(ddp.py and single.py support them)")
    seed_everything(args.seed)
    device, _ = pick_device(0)  # DataParallel keeps the master copy on the first GPU
    train(device, args)
    return 0


if __name__ == "__main__":
    run_main(main)
