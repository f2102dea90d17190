"""A world-size change with the data position carried: DCP save on N ranks, load on M, every sample once.

    python -m source_code.resilience.reshard_drill --worlds 2,1,3

When a job comes back with fewer workers (a node gone, elastic membership), three things must
carry over: the model and optimizer state (torch.distributed.checkpoint writes each rank's part
and reads into whatever layout the new world has: a replicated model reads the whole of it on
every rank, a sharded one, FSDP2 or ZeRO, reads on each rank the rows of its new shard, notebook
09; ``save``/``load`` serve both), the learning-rate choice (here: the global batch is kept, so each rank
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

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from source_code import workload


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


def sharded_train_step(model, optimizer, position: EpochPosition, dataset) -> list[int]:
    """The same step on an FSDP2 model: ``fully_shard`` reduce-scatters (and averages) the
    gradients itself, and the optimizer steps this rank's shards only."""
    rank, world = dist.get_rank(), dist.get_world_size()
    idx = position.next_indices(rank, world)
    x_all, y_all = dataset.tensors
    optimizer.zero_grad()
    workload.loss_fn(model, x_all[idx], y_all[idx]).backward()
    optimizer.step()
    return idx
