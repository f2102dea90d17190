"""What every run of notebook 17 shares: the tiny model, the batch of each step, a state digest, a step log.

Both sides of the comparison (restart from a snapshot, per-step fault tolerance) train the same
TransformerLM on the same generated sort task (source_code/workload.py), with the same batch at
every global step: a run that loses no work and a run that loses some differ only in that.

* ``build(seed)``: the model and its Adam optimizer (Adam has state: a heal must carry it too);
* ``part_batch(step, parts, part)``: the ``part``-th of ``parts`` slices of global step ``step``;
* ``digest(model, optimizer)``: SHA-256 of every parameter and optimizer tensor, byte for byte:
  two replicas are bitwise equal exactly when their digests are;
* ``gather_floats(value)``: every rank's float, all-gathered (world_size x 8 bytes);
* ``StepLog``: one JSON line per event with the wall-clock time, read back by the harnesses.
"""
from __future__ import annotations

import hashlib
import json
import time

import torch

from source_code import workload

DIM, LAYERS, HEADS = 32, 1, 2       # tiny: the lesson is about the failures, not the model
LR = 3e-3
EVAL_SAMPLES = 256


def task(n: int = 1024):
    return workload.sort_task(n=n)


def build(seed: int = 0):
    cfg = workload.model_config(dim=DIM, n_layers=LAYERS, n_heads=HEADS,
                                vocab_size=workload.SORT_VOCAB, max_len=32)
    model = workload.build_model(cfg, seed)
    return model, torch.optim.Adam(model.parameters(), lr=LR)


def part_batch(dataset, step: int, batch_size: int, parts: int, part: int):
    """This part's slice of global step ``step`` (the same samples whatever ran before)."""
    return workload.rank_slice(workload.global_batch(dataset, step, batch_size), part, parts)


@torch.no_grad()
def eval_loss(model, dataset) -> float:
    """Loss on a fixed set of samples: the 'final loss' both runs are compared with."""
    x, y = dataset.tensors
    return workload.loss_fn(model, x[:EVAL_SAMPLES], y[:EVAL_SAMPLES]).item()


def state_tensors(model, optimizer=None) -> list[torch.Tensor]:
    out = [p.detach() for p in model.parameters()]
    if optimizer is not None:
        for state in optimizer.state.values():
            out += [v for _, v in sorted(state.items()) if torch.is_tensor(v)]
    return out


def digest(model, optimizer=None) -> str:
    h = hashlib.sha256()
    for t in state_tensors(model, optimizer):
        h.update(t.detach().cpu().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def gather_floats(value: float, group=None) -> list[float]:
    import torch.distributed as dist
    mine = torch.tensor([value], dtype=torch.float64)                    # (1,) on the CPU: gloo
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(every, mine, group=group)                            # world_size x 8 bytes
    return [t.item() for t in every]


class StepLog:
    """Append-only JSON lines: ``log.write(event="step", step=3, ...)`` adds the time ``t``."""

    def __init__(self, path):
        self.path = path

    def write(self, **fields) -> None:
        if not self.path:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps({"t": time.time(), **fields}) + "\n")


def read_log(path) -> list[dict]:
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []
