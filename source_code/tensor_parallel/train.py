"""Train the TransformerLM with tensor parallelism: every block's weights split over the processes.

    torchrun --standalone --nproc-per-node=2 -m source_code.tensor_parallel.train --impl own
    torchrun --standalone --nproc-per-node=2 -m source_code.tensor_parallel.train --impl dtensor --sequence-parallel
    torchrun --standalone --nproc-per-node=4 -m source_code.tensor_parallel.train --dim 128 --heads 8
    TRAIN_MODULE=source_code.tensor_parallel.train sbatch slurm/ddp_single_node.slurm --impl own   # TP inside one node

A launch over several nodes is refused before the group forms (TP belongs on one node's fast
links); TP inside the nodes with FSDP across them is ``source_code.mesh.train_2d``.

--impl own: the hand-built layers of model.py (column/row-parallel, our collectives);
--impl dtensor: ``parallelize_module`` with ColwiseParallel/RowwiseParallel (dtensor.py).
--sequence-parallel: LayerNorms and residuals on t/n tokens, all-gather/reduce-scatter.
--vocab-parallel: token table, head and loss split over the vocabulary (own: vocab.py;
dtensor: a column-wise head under ``loss_parallel``); the vocabulary is padded to a multiple
of the processes with tokens that never occur, as Megatron-LM pads it.

Tensor parallelism alone is not data parallelism: every process sees the SAME batch (one
seed), holds 1/n of each block's weights and computes 1/n of each block's work; the loss is
the same number on every rank. Every rank builds the full dense model from one seed and keeps
its slices (fine at these sizes; at scale one builds on the meta device). Data: the generated
sort task (``data.sequence_task``). Last line: ``summary: world_size=N epochs=E accuracy=A
seconds=S`` (accuracy: held-out answer tokens predicted correctly).
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
import torch.nn.functional as F

from source_code import data, models
from source_code.cli import Parser, nonnegative_int, positive_float, positive_int
from source_code.distributed import LaunchError, print0, ranks_from_env, run_main, session
from source_code.tensor_parallel.model import TPTransformerLM
from source_code.tensor_parallel.placement import check_tp_in_node
from source_code.training import loop

LAUNCH = "torchrun --standalone --nproc-per-node=2 -m source_code.tensor_parallel.train"
MESH_LAUNCH = ("use source_code.mesh.train_2d (sbatch slurm/tp_dp_2d.slurm): TP inside each node, "
               "FSDP across the nodes")
IMPLS = ("own", "dtensor")
SEQ, VOCAB = 32, 17  # the sort task: 16 tokens, separator, 15 answers (next-token targets)


def check_args(args, world: int, env=None) -> None:
    """Every flag checked before the process group forms: one line naming the fix. TP runs over
    every rank, so the job must fit on one node (placement.check_tp_in_node)."""
    check_tp_in_node(world, world, env, what=f"tensor parallelism over all {world} processes",
                     fix=f"run it on one node, or {MESH_LAUNCH}")
    if args.dim % args.heads:
        raise LaunchError(f"error: --dim {args.dim} must be divisible by --heads {args.heads}")
    if args.heads % world:
        raise LaunchError(f"error: --heads {args.heads} do not split over {world} processes; use a "
                          f"multiple of {world}, e.g. --heads {world * max(1, args.heads // world)}")
    if args.sequence_parallel and SEQ % world:
        raise LaunchError(f"error: --sequence-parallel needs the {SEQ} tokens to split over {world} "
                          "processes; use a power of 2 processes")
    if args.samples < args.batch_size:
        raise LaunchError(f"error: --samples {args.samples} must be >= --batch-size {args.batch_size}")


def lm_loss(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)


def build(ctx, args):
    """The dense model from one seed on every rank, then this rank's tensor-parallel version."""
    torch.manual_seed(args.seed)
    vocab = -(-VOCAB // ctx.world_size) * ctx.world_size if args.vocab_parallel else VOCAB
    dense = models.TransformerLM(vocab_size=vocab, dim=args.dim, n_layers=args.layers,
                                 n_heads=args.heads, max_len=SEQ).to(ctx.device)
    if args.impl == "own":
        return TPTransformerLM(dense, ctx.rank, ctx.world_size, args.sequence_parallel,
                               args.vocab_parallel)
    from source_code.tensor_parallel import dtensor
    mesh = dtensor.init_device_mesh(ctx.device.type, (ctx.world_size,))
    return dtensor.parallelize(dense, mesh, args.sequence_parallel, args.vocab_parallel)


def full_logits(logits):
    """(b, t, vocab) on every rank: a vocabulary-split DTensor or our local slice gathered
    (evaluation only; training never needs them whole)."""
    if hasattr(logits, "full_tensor"):
        return logits.full_tensor()
    parts = [torch.empty_like(logits) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, logits.contiguous())
    return torch.cat(parts, dim=-1)


@torch.no_grad()
def accuracy(model, x, y) -> float:
    model.eval()
    logits = model(x)
    if getattr(model, "vocab_parallel", False) or hasattr(logits, "full_tensor"):
        logits = full_logits(logits)            # (b, t, vocab)
    model.train()
    mask = y != -100
    return ((logits.argmax(-1) == y)[mask].float().mean()).item()


def train(ctx, args) -> dict:
    train_x, train_y = data.sequence_task("sort", n=args.samples, seed=0).tensors
    test_x, test_y = data.sequence_task("sort", n=args.eval_samples, seed=1).tensors
    model = build(ctx, args)
    loss_ctx = contextlib.nullcontext          # a new context each step
    if args.impl == "dtensor" and args.vocab_parallel:
        from torch.distributed.tensor.parallel import loss_parallel as loss_ctx
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    n_batches = len(train_x) // args.batch_size
    if args.max_steps:
        n_batches = min(n_batches, args.max_steps)
    print0(f"training TransformerLM ({args.layers} blocks, dim {args.dim}, {args.heads} heads) on the "
           f"sort task: tensor parallel over {ctx.world_size} processes ({args.impl}"
           f"{' + sequence parallel' if args.sequence_parallel else ''}"
           f"{' + vocabulary parallel' if args.vocab_parallel else ''}), {ctx.backend} on {ctx.device.type}")
    timer, acc, losses = loop.Timer(), 0.0, []
    for epoch in range(args.epochs):
        order = torch.randperm(len(train_x), generator=torch.Generator().manual_seed(args.seed + epoch))
        total = torch.zeros((), dtype=torch.float64, device=ctx.device)   # summed here, read once an epoch
        for b in range(n_batches):
            idx = order[b * args.batch_size:(b + 1) * args.batch_size]   # the same batch on every rank
            x, y = train_x[idx].to(ctx.device), train_y[idx].to(ctx.device)
            opt.zero_grad(set_to_none=True)
            with loss_ctx():                        # loss_parallel() for a vocabulary-split DTensor head
                logits = model(x)
                loss = model.loss(logits, y) if args.impl == "own" else lm_loss(logits, y)
                loss.backward()
            if args.impl == "own":
                model.sync_sp_grads()               # no-op without sequence parallelism
            opt.step()
            total += (loss.full_tensor() if hasattr(loss, "full_tensor") else loss).detach()
        acc = accuracy(model, test_x.to(ctx.device), test_y.to(ctx.device))
        losses.append(total.item() / n_batches)
        print0(f"epoch {epoch + 1:3d}/{args.epochs}  loss {losses[-1]:.4f}  held-out token "
               f"accuracy {acc:.4f}  steps {n_batches}  {timer.seconds:6.1f}s")
    print0(loop.summary_line(ctx.world_size, args.epochs, acc, timer.seconds, losses))
    return {"accuracy": acc}


def main(argv=None):
    ap = Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--impl", default="own", choices=IMPLS)
    ap.add_argument("--sequence-parallel", action="store_true")
    ap.add_argument("--vocab-parallel", action="store_true", help="split token table, head and loss over the vocabulary")
    ap.add_argument("--batch-size", type=positive_int, default=32)
    ap.add_argument("--epochs", type=positive_int, default=3)
    ap.add_argument("--samples", type=positive_int, default=2048, help="training examples of the sort task")
    ap.add_argument("--eval-samples", type=positive_int, default=256, help="held-out examples")
    ap.add_argument("--max-steps", type=nonnegative_int, default=0, help="stop each epoch after this many steps (0: all)")
    ap.add_argument("--layers", type=positive_int, default=2)
    ap.add_argument("--dim", type=positive_int, default=64)
    ap.add_argument("--heads", type=positive_int, default=4)
    ap.add_argument("--lr", type=positive_float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    found = ranks_from_env()
    if found is None:
        raise LaunchError(f"error: no launcher found (RANK/WORLD_SIZE not set); run it as: {LAUNCH}")
    check_args(args, found[2])
    torch.set_num_threads(1)  # one core per process: the processes are the parallelism
    with session(launch_hint=LAUNCH, seed=args.seed) as ctx:
        train(ctx, args)
    return 0


if __name__ == "__main__":
    run_main(main)
