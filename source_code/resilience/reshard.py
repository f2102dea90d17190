"""A world-size change with the data position carried: DCP save on N ranks, load on N-1, every sample once.

    python -m source_code.resilience.reshard --before 3 --after 2 --steps-before 4

When a job comes back with fewer workers (a node gone, elastic membership), three things must
carry over: the model and optimizer state (torch.distributed.checkpoint re-lays it out for the
new world, notebook 09), the learning-rate choice (here: the global batch is kept, so each rank
takes a bigger slice and the optimizer sees the same batches), and **where in the epoch** the
job was. A DistributedSampler restarted on the new world would replay the epoch from its start,
or (skipping by a per-rank count) skip or repeat samples, because its shard depends on the
world size. The position that survives a world-size change is a *global* one:
* ``EpochPosition``: the epoch's shuffled order (seed + epoch) and the number of samples of it
  consumed by the whole job; global batch ``i`` is ``order[i*B:(i+1)*B]`` on any world size, and
  rank r of N takes the r-th of N slices of it;
* it is saved in the same DCP checkpoint as the model (``state_dict``/``load_state_dict``).
"""
from __future__ import annotations

import os
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from source_code import processes, workload
from source_code.cli import Parser, positive_int
from source_code.errors import LaunchError, run_main
from source_code.resilience import common


class EpochPosition:
    def __init__(self, n: int, batch_size: int, seed: int = 0):
        self.n, self.batch_size, self.seed = n, batch_size, seed
        self.epoch, self.consumed = 0, 0

    def next_indices(self, rank: int, world: int) -> list[int]:
        """This rank's sample indices of the next global batch; advances the global position."""
        if self.batch_size % world:
            raise ValueError(f"global batch {self.batch_size} does not split over {world} ranks")
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + self.epoch))
        batch = order[self.consumed:self.consumed + self.batch_size]         # (B,)
        self.consumed += self.batch_size
        per = self.batch_size // world
        return batch[rank * per:(rank + 1) * per].tolist()

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "consumed": self.consumed}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.consumed = int(state["epoch"]), int(state["consumed"])


def save(path: str, model, optimizer, position: EpochPosition) -> None:
    """Model, optimizer and data position in one DCP checkpoint (each rank writes its part)."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd, "data": position.state_dict()},
             storage_writer=dcp.FileSystemWriter(path, overwrite=True))   # a redone step writes again


def load(path: str, model, optimizer, position: EpochPosition) -> None:
    """The checkpoint of ``save``, re-laid out for this world size, into model, optimizer, position."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd, "data": position.state_dict()}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    position.load_state_dict(state["data"])


def train_step(model, optimizer, position: EpochPosition, dataset) -> list[int]:
    """One data-parallel step on this rank's slice of the next global batch; its sample indices."""
    rank, world = dist.get_rank(), dist.get_world_size()
    idx = position.next_indices(rank, world)
    x_all, y_all = dataset.tensors
    optimizer.zero_grad()
    workload.loss_fn(model, x_all[idx], y_all[idx]).backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)          # the sum (gloo has no AVG before torch 2.8), then the mean
        p.grad /= world
    optimizer.step()
    return idx


def _phase(path: str, steps: int, batch_size: int, resume: bool, n_samples: int) -> list[int]:
    """Train ``steps`` global steps (all remaining ones when 0) on this world; return the indices seen."""
    dataset = common.task(n_samples)
    model, optimizer = common.build(0)
    position = EpochPosition(len(dataset), batch_size)
    if resume:
        load(path, model, optimizer, position)                 # re-laid out for this world size
    seen = []
    total = len(dataset) // batch_size
    for _ in range(steps or total - position.consumed // batch_size):
        seen += train_step(model, optimizer, position, dataset)
    if not resume:
        save(path, model, optimizer, position)
    return seen


def drill(before: int = 3, after: int = 2, steps_before: int = 4, batch_size: int = 24,
          n_samples: int = 240, stream=None) -> dict:
    """Train part of an epoch on ``before`` ranks, save, finish it on ``after`` ranks; count samples."""
    if batch_size % before or batch_size % after:
        raise ValueError(f"the global batch {batch_size} must split over {before} and over {after} ranks")
    if steps_before * batch_size >= n_samples:
        raise ValueError(f"{steps_before} steps of {batch_size} must stop inside the epoch of {n_samples} samples")
    path = tempfile.mkdtemp(prefix="reshard_")
    first = processes.spawn(_phase, before, path, steps_before, batch_size, False, n_samples,
                            device="cpu", stream=stream)
    second = processes.spawn(_phase, after, path, 0, batch_size, True, n_samples, device="cpu", stream=stream)
    seen = [i for part in first + second for i in part]
    expected = (n_samples // batch_size) * batch_size                # full batches only (drop_last)
    return {"seen": len(seen), "unique": len(set(seen)), "expected": expected,
            "before": before, "after": after, "consumed_before": steps_before * batch_size,
            "files": sorted(os.listdir(path))}


def naive_resume(n: int, batch_size: int, before: int, after: int, steps_before: int) -> dict:
    """The same change with a per-rank position: DistributedSampler shards, and each rank of the new
    world skips as many samples as a rank of the old one had yielded (a per-rank sampler state, as
    a data loader's state_dict keeps it). Counts what that trains on (the negative control)."""
    from torch.utils.data import DistributedSampler
    data = range(n)

    def shard(world, rank):
        return list(DistributedSampler(data, world, rank, shuffle=True, seed=0, drop_last=True))
    seen = [i for r in range(before) for i in shard(before, r)[:steps_before * (batch_size // before)]]
    done = steps_before * (batch_size // before)                 # what each old rank yielded
    seen += [i for r in range(after) for i in shard(after, r)[done:]]
    return {"seen": len(seen), "unique": len(set(seen)), "repeated": len(seen) - len(set(seen)),
            "skipped": n - len(set(seen))}


def main(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--before", type=positive_int, default=3)
    p.add_argument("--after", type=positive_int, default=2)
    p.add_argument("--steps-before", type=positive_int, default=4)
    p.add_argument("--batch-size", type=positive_int, default=24)
    p.add_argument("--samples", type=positive_int, default=240, help="samples in the epoch")
    a = p.parse_args(argv)
    if a.batch_size % a.before or a.batch_size % a.after:
        raise LaunchError(f"error: --batch-size {a.batch_size} must divide by --before and --after")
    if a.steps_before * a.batch_size >= a.samples:
        raise LaunchError("error: --steps-before x --batch-size must stop inside the epoch (below --samples)")
    r = drill(a.before, a.after, a.steps_before, a.batch_size, a.samples)
    print(f"summary: world {r['before']} -> {r['after']} after {r['consumed_before']} samples: "
          f"seen={r['seen']} unique={r['unique']} expected={r['expected']} exactly_once="
          f"{int(r['seen'] == r['unique'] == r['expected'])}")
    return 0


if __name__ == "__main__":
    run_main(main)
