"""Train the TransformerLM with pipeline parallelism: one stage per process.

    torchrun --standalone --nproc-per-node=2 -m source_code.pipeline.train --schedule 1f1b
    torchrun --standalone --nproc-per-node=2 -m source_code.pipeline.train --schedule gpipe --microbatches 8
    torchrun --standalone --nproc-per-node=4 -m source_code.pipeline.train --schedule lib-interleaved-1f1b --layers 8
    TRAIN_MODULE=source_code.pipeline.train sbatch slurm/ddp_multinode.slurm --schedule 1f1b   # 2 nodes x 2

Schedules: naive (the whole batch through the stages, --microbatches 1), gpipe, 1f1b (built
here from send/recv, ``schedules.run_step``), and torch.distributed.pipelining's
lib-gpipe, lib-1f1b, lib-interleaved-1f1b (two stages per process, looped).

The data is the generated sort task (``data.sequence_task``): every process draws the same
batches from one seed; stage 0 uses the tokens, the last stage the targets.

Where the loss goes: only the LAST stage computes it, but rank 0 prints. At the end of each
epoch the last stage's summed loss is broadcast from the last rank (``dist.broadcast(...,
src=last)``), so every rank, rank 0 included, holds it; the held-out accuracy is computed the
same way (a forward-only pass through the pipeline, the last stage counts correct tokens).
Last line: ``summary: world_size=P epochs=E accuracy=A seconds=S`` (accuracy: held-out tokens
of the sorted answer predicted correctly).
"""
from __future__ import annotations

import functools

import torch
import torch.distributed as dist

from source_code import data, models
from source_code.cli import Parser, nonnegative_int, positive_float, positive_int
from source_code.distributed import LaunchError, print0, ranks_from_env, run_main, session
from source_code.pipeline import library, simulator, stages
from source_code.pipeline.comms import StageLink
from source_code.pipeline.schedules import run_step
from source_code.training import loop

LAUNCH = "torchrun --standalone --nproc-per-node=2 -m source_code.pipeline.train"
OWN = simulator.SCHEDULES
SUPPORTED = OWN + ("lib-gpipe", "lib-1f1b", "lib-interleaved-1f1b")
SEQ = 32  # tokens per example of the sort task (16 to sort, separator, 15 answers shifted)


def check_args(args, world: int) -> None:
    """Every flag checked before the process group forms: one line naming the fix."""
    if args.schedule not in SUPPORTED:
        raise LaunchError(f"error: --schedule {args.schedule!r} unknown; choose one of {', '.join(SUPPORTED)}")
    if args.schedule.startswith("lib-") and args.schedule not in library.available():
        raise LaunchError(library.refusal(args.schedule))
    if world < 2:
        raise LaunchError(f"error: a pipeline needs at least 2 processes (one per stage); run: {LAUNCH}")
    if args.schedule == "naive" and args.microbatches != 1:
        raise LaunchError("error: --schedule naive sends the whole batch at once; use --microbatches 1 "
                          "(or --schedule gpipe to cut it into microbatches)")
    if args.batch_size % args.microbatches:
        raise LaunchError(f"error: --batch-size {args.batch_size} does not split into --microbatches "
                          f"{args.microbatches}; use a multiple, e.g. --batch-size "
                          f"{(args.batch_size // args.microbatches + 1) * args.microbatches}")
    n_stages = library.n_stages(args.schedule, world) if args.schedule.startswith("lib-") else world
    if args.layers < n_stages:
        raise LaunchError(f"error: --layers {args.layers} cannot fill {n_stages} stages "
                          f"({args.schedule} on {world} processes); use --layers {n_stages} or more")
    if args.schedule == "lib-interleaved-1f1b" and args.microbatches % world:
        raise LaunchError(f"error: lib-interleaved-1f1b needs --microbatches a multiple of the "
                          f"{world} processes, e.g. --microbatches {world * max(1, args.microbatches // world)}")
    if args.dim % args.heads:
        raise LaunchError(f"error: --dim {args.dim} must be divisible by --heads {args.heads}")


def token_accuracy(logits, targets, n_valid: int):
    """Correct answer tokens of one microbatch / answer tokens of the whole batch (the last stage)."""
    mask = targets != -100                                      # (b, t)
    return (logits.argmax(-1) == targets)[mask].sum().float() / n_valid


class Pipeline:
    """This rank's stages and how to train and evaluate them with the chosen schedule."""

    def __init__(self, ctx, args):
        self.ctx, self.args, p = ctx, args, ctx.world_size
        torch.manual_seed(args.seed)  # every rank builds the same full model, keeps its slice
        full = models.TransformerLM(vocab_size=17, dim=args.dim, n_layers=args.layers,
                                    n_heads=args.heads, max_len=SEQ)
        self.lib = args.schedule.startswith("lib-")
        self.n_stages = library.n_stages(args.schedule, p) if self.lib else p
        self.ids = library.stage_ids(args.schedule, ctx.rank, p) if self.lib else [ctx.rank]
        self.mods = [stages.TransformerStage(full, i, self.n_stages).to(ctx.device) for i in self.ids]
        self.stage_rank = [i % p for i in range(self.n_stages)]  # own and looped layouts
        self.links = [StageLink(i, self.n_stages, ctx.device, ranks=self.stage_rank) for i in self.ids]
        self.last_rank = self.stage_rank[-1]
        params = [q for mod in self.mods for q in mod.parameters()]
        self.opt = torch.optim.AdamW(params, lr=args.lr)
        self.m = args.microbatches
        self.shape = (args.batch_size // self.m, SEQ, args.dim)   # one microbatch's activation
        self.schedule = None
        if self.lib:
            loss = functools.partial(_lib_loss, self)
            self.schedule = library.build(args.schedule, dict(zip(self.ids, self.mods)), ctx.rank,
                                          p, self.m, ctx.device, loss)

    def train_step(self, x, y) -> float:
        """One step; returns the batch loss on the last stage's rank (0.0 elsewhere)."""
        self.opt.zero_grad(set_to_none=True)
        n_valid = int((y != -100).sum())
        x, y = x.to(self.ctx.device), y.to(self.ctx.device)
        if self.lib:
            self.n_valid = n_valid  # read by _lib_loss, the loss_fn given to the library
            loss = library.step(self.schedule, self.args.schedule, self.ctx.rank,
                                self.ctx.world_size, x, y) or 0.0
        else:
            s, link = self.ids[0], self.links[0]
            order = simulator.stage_order(self.args.schedule, self.n_stages, self.m, s)
            rep = run_step(self.mods[0], order, link, self.shape,
                           inputs=list(x.chunk(self.m)) if s == 0 else None,
                           targets=list(y.chunk(self.m)) if s == self.n_stages - 1 else None,
                           loss_fn=functools.partial(stages.lm_loss, n_valid=n_valid))
            loss = sum(rep["losses"])
        self.opt.step()
        return loss

    @torch.no_grad()
    def accuracy(self, x, y) -> float:
        """Forward-only pass through every stage (``forward_only``); the last stage counts."""
        n_valid = int((y != -100).sum())
        xs, ys = x.to(self.ctx.device).chunk(self.m), y.to(self.ctx.device).chunk(self.m)
        for mod in self.mods:
            mod.eval()
        counted = forward_only(self.mods, self.ids, self.links, self.n_stages, xs,
                               (len(xs[0]), SEQ, self.args.dim),
                               lambda logits, i: token_accuracy(logits, ys[i], n_valid))
        for mod in self.mods:
            mod.train()
        return sum(float(v) for v in counted)

    def from_last(self, value: float) -> float:
        """The last stage's number, on every rank (rank 0 prints it)."""
        t = torch.tensor([value], dtype=torch.float64, device=self.ctx.device)
        dist.broadcast(t, src=self.last_rank)
        return t.item()


def forward_only(mods, ids, links, n_stages: int, xs, shape, count) -> list:
    """This rank's part of a forward pass of the microbatches ``xs`` through all stages.

    ``mods``, ``ids``, ``links``: this rank's stages, their indices and StageLinks, in stage
    order; ``shape``: one microbatch's activation; ``count(output, i)``: what the last stage
    keeps of microbatch i (returned in a list). For microbatch i the rank goes through its
    stages (receive, compute, send on), then takes microbatch i + 1. So every rank posts its
    messages in one global order, (microbatch, stage), and each send meets a receive that is
    posted or about to be, whatever the backend buffers. In the looped layouts (rank r holds
    stages r and r + p) the last rank sends to rank 0: a pass stage by stage (all microbatches
    through stage r, then through r + p) has the last rank wait to hand stage p its first
    microbatch while rank 0 still waits to hand stage 1 its second, which NCCL only survives
    while the activations fit in its buffers."""
    counted = []
    for i in range(len(xs)):
        for mod, s, link in zip(mods, ids, links):
            h = xs[i] if s == 0 else link.exchange(recv=(shape, torch.float32, "prev"))  # (b, t) | (b, t, dim)
            out = mod(h)                                       # (b, t, dim) | last: (b, t, vocab)
            if s == n_stages - 1:
                counted.append(count(out, i))
            else:
                link.exchange(send=(out, "next"))
    for link in links:
        link.flush()
    return counted


def _lib_loss(pipe, logits, targets):
    return stages.lm_loss(logits, targets, pipe.n_valid)


def train(ctx, args) -> dict:
    train_x, train_y = data.sequence_task("sort", n=args.samples, seed=0).tensors
    test_x, test_y = data.sequence_task("sort", n=args.eval_samples, seed=1).tensors
    pipe = Pipeline(ctx, args)
    n_batches = len(train_x) // args.batch_size
    if args.max_steps:
        n_batches = min(n_batches, args.max_steps)
    print0(f"training TransformerLM ({args.layers} blocks, dim {args.dim}) on the sort task: "
           f"{pipe.n_stages} stages on {ctx.world_size} processes, schedule {args.schedule}, "
           f"batch {args.batch_size} = {pipe.m} microbatches, {ctx.backend} on {ctx.device.type}")
    timer, accuracy = loop.Timer(), 0.0
    eval_batch = (args.eval_samples // pipe.m) * pipe.m
    losses = []
    for epoch in range(args.epochs):
        order = torch.randperm(len(train_x), generator=torch.Generator().manual_seed(args.seed + epoch))
        total = 0.0
        for b in range(n_batches):
            idx = order[b * args.batch_size:(b + 1) * args.batch_size]  # same batch on every rank
            total += pipe.train_step(train_x[idx], train_y[idx])
        loss = pipe.from_last(total / n_batches)
        losses.append(loss)
        accuracy = pipe.from_last(pipe.accuracy(test_x[:eval_batch], test_y[:eval_batch]))
        print0(f"epoch {epoch + 1:3d}/{args.epochs}  loss {loss:.4f}  held-out token accuracy "
               f"{accuracy:.4f}  steps {n_batches}  {timer.seconds:6.1f}s")
    print0(loop.summary_line(ctx.world_size, args.epochs, accuracy, timer.seconds, losses))
    return {"accuracy": accuracy}


def main(argv=None):
    ap = Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--schedule", default="1f1b", choices=SUPPORTED)
    ap.add_argument("--microbatches", type=positive_int, default=4, help="m: microbatches per batch")
    ap.add_argument("--batch-size", type=positive_int, default=32, help="examples per step (all microbatches)")
    ap.add_argument("--epochs", type=positive_int, default=3)
    ap.add_argument("--samples", type=positive_int, default=2048, help="training examples of the sort task")
    ap.add_argument("--eval-samples", type=positive_int, default=256, help="held-out examples")
    ap.add_argument("--max-steps", type=nonnegative_int, default=0, help="stop each epoch after this many steps (0: all)")
    ap.add_argument("--layers", type=positive_int, default=4, help="transformer blocks, divided among the stages")
    ap.add_argument("--dim", type=positive_int, default=64)
    ap.add_argument("--heads", type=positive_int, default=4)
    ap.add_argument("--lr", type=positive_float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    found = ranks_from_env()
    if found is None:
        raise LaunchError(f"error: no launcher found (RANK/WORLD_SIZE not set); run it as: {LAUNCH}")
    check_args(args, found[2])
    if args.samples < args.batch_size or args.eval_samples < args.microbatches:
        raise LaunchError("error: --samples must be >= --batch-size and --eval-samples >= --microbatches")
    torch.set_num_threads(1)  # one core per stage: the processes are the parallelism
    with session(launch_hint=LAUNCH, seed=args.seed) as ctx:
        train(ctx, args)
    return 0


if __name__ == "__main__":
    run_main(main)
