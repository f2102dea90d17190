"""FSDP2 training of the TransformerLM, with sharded (DCP) checkpoints: resume on any number of ranks.

    torchrun --standalone --nproc-per-node=2 -m source_code.sharding.train
    torchrun --standalone --nproc-per-node=2 -m source_code.sharding.train --epochs 2 --checkpoint ckpt
    torchrun --standalone --nproc-per-node=4 -m source_code.sharding.train --epochs 4 --checkpoint ckpt --resume
    torchrun --standalone --nproc-per-node=2 -m source_code.sharding.train --dataset wikitext2 --data-dir DIR

The generated sort task by default (WikiText-2 characters after
``python -m source_code.data prepare --dataset wikitext2``). The model is built on the meta
device and sharded per block (fsdp.py), so no rank ever holds the whole model. Every global
batch is the same whatever the number of ranks (workload.epoch_batch), each rank takes its
B/N samples, so a run resumed with another number of ranks continues the same training. A
DCP checkpoint is written after every epoch (checkpointing.py); ``--export PATH`` writes the
full, unsharded weights and optimizer state from rank 0 at the end (for inference or export).
Every flag is checked before the process group forms. Last line:

    summary: world_size=N epochs=E accuracy=A seconds=S steps=K loss=L
"""
from __future__ import annotations

import torch
from torch.distributed.device_mesh import init_device_mesh

from source_code import data
from source_code.cli import Parser, nonnegative_int, positive_float, positive_int
from source_code.distributed import LaunchError, all_reduce_mean, print0, ranks_from_env, run_main, session
from source_code import workload
from source_code.sharding import checkpointing
from source_code.sharding.fsdp import build_sharded
from source_code.training import loop

LAUNCH = "torchrun --standalone --nproc-per-node=2 -m source_code.sharding.train"
DATASETS = ("sort", "copy", "wikitext2")


def parse_args(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="sort", choices=DATASETS)
    p.add_argument("--data-dir", default=None,
                   help="where `prepare` put wikitext2 (default: $WORKSHOP_DATA, else data)")
    p.add_argument("--dim", type=positive_int, default=64)
    p.add_argument("--layers", type=positive_int, default=2)
    p.add_argument("--heads", type=positive_int, default=4)
    p.add_argument("--epochs", type=positive_int, default=3)
    p.add_argument("--max-steps", type=nonnegative_int, default=8, help="steps per epoch (0: the whole data)")
    p.add_argument("--batch-size", type=positive_int, default=32, help="GLOBAL batch, divided among the ranks")
    p.add_argument("--lr", type=positive_float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-reshard", action="store_true",
                   help="reshard_after_forward=False (ZeRO-2-like: keep parameters until backward)")
    p.add_argument("--checkpoint", default="", help="DCP checkpoint directory, written every epoch")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint if it holds one")
    p.add_argument("--export", default="", help="write the full state dicts here at the end (rank 0)")
    return p.parse_args(argv)


def check(args):
    """Every flag, before any process group exists: one line naming the fix. Returns the data."""
    found = ranks_from_env()
    world = found[2] if found else 1
    for name in ("dim", "layers", "heads", "epochs", "batch_size"):
        if getattr(args, name) < 1:
            raise LaunchError(f"error: --{name.replace('_', '-')} must be >= 1")
    if args.max_steps < 0 or args.lr <= 0:
        raise LaunchError("error: --max-steps must be >= 0 and --lr > 0")
    if args.dim % args.heads:
        raise LaunchError(f"error: --dim {args.dim} must be a multiple of --heads {args.heads}")
    if args.batch_size % world:
        raise LaunchError(f"error: --batch-size {args.batch_size} does not divide among {world} "
                          f"processes; use a multiple of {world}, e.g. "
                          f"{(args.batch_size // world + 1) * world}")
    if args.resume and not args.checkpoint:
        raise LaunchError("error: --resume needs --checkpoint DIR (the directory to continue from)")
    args.data_dir = data.resolve_dir(args.data_dir)
    train_set = data.load(args.dataset, "train", args.data_dir)   # MissingData names `prepare`
    test_set = data.load(args.dataset, "test", args.data_dir)
    if len(train_set) < args.batch_size:
        raise LaunchError(f"error: --batch-size {args.batch_size} exceeds the {len(train_set)} "
                          "training examples; use a smaller one")
    cfg = model_config(args, train_set)
    if args.resume and checkpointing.latest(args.checkpoint):
        checkpointing.verify(args.checkpoint)                # damaged files: one line, exit 2
        saved = checkpointing.read_progress(args.checkpoint)
        if saved["config"] != cfg:
            raise checkpointing.CheckpointMismatch(
                f"error: {args.checkpoint} holds a model {saved['config']} but the flags build "
                f"{cfg}; use the same --dim/--layers/--heads/--dataset or a new --checkpoint")
    return train_set, test_set, cfg


def model_config(args, train_set) -> dict:
    vocab = len(train_set.vocab) if hasattr(train_set, "vocab") else 32
    seq = train_set.tensors[0].shape[1]
    return workload.model_config(dim=args.dim, n_layers=args.layers, n_heads=args.heads,
                                 vocab_size=vocab, max_len=max(64, seq))


def train(ctx, args, train_set, test_set, cfg) -> dict:
    batch = loop.per_rank_batch(args.batch_size, ctx.world_size)
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    model = build_sharded(cfg, mesh, args.seed, ctx.device, meta=True,
                          reshard_after_forward=not args.no_reshard)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    start_epoch, step = 0, 0
    if args.resume and checkpointing.latest(args.checkpoint):
        progress = checkpointing.load(args.checkpoint, model, opt)
        start_epoch, step = progress["epoch"], progress["step"]
        print0(f"resumed from {checkpointing.latest(args.checkpoint)} (saved by "
               f"{progress['world_size']} ranks) after epoch {start_epoch}, step {step}")
    elif args.resume:
        print0(f"no checkpoint under {args.checkpoint} yet: starting from scratch")
    per_epoch = len(train_set) // args.batch_size
    per_epoch = min(per_epoch, args.max_steps) if args.max_steps else per_epoch
    held_out = [t[:512].to(ctx.device) for t in test_set.tensors]
    n_params = sum(p.numel() for p in model.parameters())
    print0(f"FSDP2 training TransformerLM ({n_params:,d} parameters, {ctx.world_size} shards) on "
           f"{args.dataset}: global batch {args.batch_size} ({batch} per rank), {per_epoch} steps "
           f"per epoch, {ctx.backend} on {ctx.device.type}")
    timer, loss, accuracy = loop.Timer(), float("nan"), 0.0
    for epoch in range(start_epoch, args.epochs):
        total = 0.0
        for i in range(per_epoch):
            x, y = workload.rank_slice(workload.epoch_batch(train_set, epoch, i, args.batch_size,
                                                            args.seed), ctx.rank, ctx.world_size)
            loss_t = workload.loss_fn(model, x.to(ctx.device), y.to(ctx.device))
            loss_t.backward()
            opt.step()
            opt.zero_grad()
            total += loss_t.item()
            step += 1
        loss = all_reduce_mean(total / max(per_epoch, 1))
        accuracy = workload.token_accuracy(model, *held_out)  # every rank: FSDP forward is collective
        print0(f"epoch {epoch + 1:3d}/{args.epochs}  loss {loss:.4f}  held-out token accuracy "
               f"{accuracy:.4f}  step {step}  {timer.seconds:6.1f}s")
        if args.checkpoint:
            path = checkpointing.save(args.checkpoint, model, opt, {
                "epoch": epoch + 1, "step": step, "world_size": ctx.world_size, "config": cfg})
            print0(f"checkpoint {path} ({ctx.world_size} shards)")
    if start_epoch >= args.epochs:
        accuracy = workload.token_accuracy(model, *held_out)
    if args.export:
        checkpointing.export(args.export, model, opt)
        print0(f"full state dicts written to {args.export}")
    print0(loop.summary_line(ctx.world_size, args.epochs, accuracy, timer.seconds)
           + f" steps={step} loss={loss:.4f}")
    return {"accuracy": accuracy, "steps": step}


def main(argv=None):
    args = parse_args(argv)
    train_set, test_set, cfg = check(args)
    torch.set_num_threads(1)  # one core per process: on CPU the processes are the parallelism
    with session(launch_hint=LAUNCH, seed=args.seed) as ctx:
        train(ctx, args, train_set, test_set, cfg)
    return 0


if __name__ == "__main__":
    run_main(main)
