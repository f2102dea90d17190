"""The pieces every training script of the data-parallel track shares.

The scripts single.py, dataparallel.py and ddp.py differ only in how they distribute the
work; the loop, the evaluation and the command-line flags live here so that the notebook can
show exactly those differences.
"""
from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from source_code import data, models
from source_code.cli import fraction, nonnegative_int, positive_float, positive_int, writable_path
from source_code.errors import LaunchError


def add_common_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Flags shared by the training scripts; defaults run in seconds on 2 CPU cores."""
    p.add_argument("--dataset", default="digits", help="digits (embedded) | mnist | cifar10")
    p.add_argument("--data-dir", default=None,
                   help="where `prepare` put the real datasets (default: $WORKSHOP_DATA, else data)")
    p.add_argument("--model", default="smallcnn", help="smallcnn | resnet18")
    p.add_argument("--epochs", type=positive_int, default=8)
    p.add_argument("--batch-size", type=positive_int, default=64,
                   help="GLOBAL batch size: divided evenly among the processes")
    p.add_argument("--lr", type=positive_float, default=0.05)
    p.add_argument("--momentum", type=fraction, default=0.9)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-steps", type=nonnegative_int, default=0,
                   help="stop each epoch after this many steps (0: all)")
    p.add_argument("--workers", type=nonnegative_int, default=None,
                   help="DataLoader worker processes per rank (default: 4 for image "
                        "datasets on a GPU, else 0: the embedded data is already in memory)")
    p.add_argument("--checkpoint", type=writable_path, default="",
                   help="snapshot path, written atomically after every epoch")
    p.add_argument("--resume", action="store_true",
                   help="continue from --checkpoint if it exists (else start fresh and say so)")
    return p


def check_args(args) -> None:
    """What the flag types cannot see alone; run before the process group forms."""
    if args.resume and not args.checkpoint:
        raise LaunchError("error: --resume needs --checkpoint PATH (the snapshot to continue from)")
    if getattr(args, "snapshot_every", 0) and not args.checkpoint:
        raise LaunchError("error: --snapshot-every needs --checkpoint PATH (where to write them)")
    models.check_name(args.model)
    data.check_fits(args.dataset, data.IMAGES, args.model)
    args.data_dir = data.resolve_dir(args.data_dir)


def per_rank_batch(global_batch: int, world_size: int) -> int:
    if global_batch % world_size:
        raise LaunchError(f"error: --batch-size {global_batch} does not divide among {world_size} "
                         f"processes; use a multiple of {world_size}, e.g. "
                         f"{(global_batch // world_size + 1) * world_size}")
    return global_batch // world_size


def loader(dataset, batch_size: int, device, workers: int | None, sampler=None,
           shuffle: bool = False) -> DataLoader:
    """A DataLoader that feeds ``device`` well.

    On a GPU: pinned (page-locked) host memory, so ``.to(device, non_blocking=True)`` copies
    while the GPU still computes. Workers: the embedded digits are tensors in memory (workers
    would only add start-up time); image files are decoded by ``workers`` processes per rank.
    """
    if workers is None:
        in_memory = isinstance(dataset, torch.utils.data.TensorDataset)
        workers = 0 if in_memory or device.type != "cuda" else 4
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, shuffle=shuffle,
                      num_workers=workers, persistent_workers=workers > 0,
                      pin_memory=device.type == "cuda")


def build(args, device) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The model (seeded by --seed, identical on every rank) and its SGD optimizer."""
    torch.manual_seed(args.seed)
    kwargs = {"in_channels": data.in_channels(args.dataset)} if args.model == "smallcnn" else {}
    model = models.build_model(args.model, **kwargs).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    return model, opt


def train_epoch(model, loader, optimizer, device, max_steps: int = 0, skip: int = 0,
                loss_sum: float = 0.0, every: int = 0, on_step=None) -> tuple[float, int]:
    """One pass over ``loader``; returns (mean loss of this process, number of steps).

    Resuming in the middle of an epoch: ``skip`` batches were trained before the snapshot (the
    sampler gives the same order again after ``set_epoch``), ``loss_sum`` their summed loss.
    ``on_step(steps, loss_sum)`` runs after every ``every``-th step (a mid-epoch snapshot).

    The summed loss stays on the device and is read once, at the end: ``loss.item()`` at every
    step would make the CPU wait for the GPU each time. It is summed in float64, which adds
    the float32 losses exactly as Python floats did, so the printed numbers stay the same.
    """
    model.train()
    total, steps = torch.tensor(float(loss_sum), dtype=torch.float64, device=device), 0
    last = min(len(loader), max_steps) if max_steps else len(loader)
    for x, y in loader:
        steps += 1
        if steps <= skip:  # already trained before the snapshot: only advance the order
            continue
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        total += loss.detach()
        if on_step and every and steps % every == 0 and steps < last:
            on_step(steps, total.item())
        if steps >= last:
            break
    return total.item() / max(steps, 1), steps


@torch.no_grad()
def evaluate(model, loader, device) -> float:
    """Accuracy of ``model`` on ``loader`` (call on one process: no collectives inside); the
    count stays on the device until the end (no wait for the GPU per batch)."""
    model.eval()
    correct, seen = torch.zeros((), dtype=torch.long, device=device), 0
    for x, y in loader:
        pred = model(x.to(device)).argmax(dim=1)
        correct += (pred == y.to(device)).sum()
        seen += len(y)
    return correct.item() / max(seen, 1)


class Timer:
    def __init__(self):
        self.start = time.perf_counter()

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.start


def summary_line(world_size: int, epochs: int, accuracy: float, seconds: float,
                 losses: list[float] = ()) -> str:
    """The last line every training script prints; tests and notebooks read it with
    parse_summary. ``losses``: the mean loss of every epoch, as the epoch lines print them (the
    last LOSSES_SHOWN of a longer run, so that one line stays a line)."""
    line = f"summary: world_size={world_size} epochs={epochs} accuracy={accuracy:.4f} seconds={seconds:.1f}"
    shown = list(losses)[-LOSSES_SHOWN:]
    return line + (" losses=[" + ",".join(f"{loss:.4f}" for loss in shown) + "]" if shown else "")


LOSSES_SHOWN = 100


def _value(text: str):
    if text.startswith("[") and text.endswith("]"):
        return json.loads(text)
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_records(text: str, prefix: str) -> list[dict]:
    """The key=value words of every ``prefix: key=value ...`` line in ``text``, in order: the
    structured lines scripts hand back (numbers as int or float, ``[1.5,2]`` as a list,
    anything else as text). Words without ``=`` are prose for the reader and skipped,
    and so are lines of the launcher or other programs."""
    return [{k: _value(v) for k, v in (w.split("=", 1) for w in ln.split()[1:] if "=" in w)}
            for ln in text.splitlines() if ln.startswith(prefix + ":")]


def parse_summary(text: str) -> dict:
    """The key=value pairs of the last `summary:` line in ``text``."""
    return parse_records(text, "summary")[-1]
