"""Who reads which sample: by shard, by sample, and the global cursor that survives a change of
world size.

Splitting an epoch among W ranks (sample ids, or PAD for an empty slot that weighs nothing):
* ``by_shard``: rank r reads whole shards r, r+W, r+2W, ... (WebDataset's ``split_by_node``):
  no shard is opened twice, but 10 shards over 4 ranks give 3, 3, 2, 2 shards, and a rank with
  fewer batches leaves DDP's all-reduce with a missing partner;
* ``by_sample``: rank r reads samples r, r+W, ...: the counts differ by one at most, and
  ``fix`` makes them equal: "drop" the last samples (lost for this epoch), "pad" with PAD
  slots (nothing lost, nothing repeated: a pad's loss weight is 0).

The global cursor: an epoch is one shuffled order of all n sample ids (seeded by the epoch,
the same on every rank and every world size), and the whole job keeps ONE number, how many
positions of that order it has trained (``consumed``). The next global batch is the next B
positions; rank r of W trains the r-th of W equal slices of it; the epoch's last, short batch
is padded with PAD so that every rank makes the same number of steps. Saved with the model
(``state_dict``), it resumes on any W that divides B with every sample exactly once: a
per-rank count ("rank r has read k samples") means other samples on another W.
"""
from __future__ import annotations

import torch

PAD = -1   # an empty slot: the rank computes on it (same shapes, same collectives), its loss weight is 0


def by_shard(shards: list[list[int]], rank: int, world: int) -> list[int]:
    """The ids of the whole shards rank, rank + world, ... in order."""
    return [i for shard in shards[rank::world] for i in shard]


def by_sample(ids: list[int], rank: int, world: int, fix: str | None = None) -> list[int]:
    """Every world-th id from the rank-th on; ``fix`` "drop" or "pad" makes the counts equal."""
    mine = ids[rank::world]
    if fix == "drop":
        return mine[:len(ids) // world]                       # the epoch's last few samples go
    if fix == "pad":
        return mine + [PAD] * (-(-len(ids) // world) - len(mine))
    return mine


def steps(items: list[int], batch: int) -> int:
    """Batches of ``batch`` (the last one may be short) in a rank's list."""
    return -(-len(items) // batch)


def epoch_order(n: int, epoch: int, seed: int = 0) -> list[int]:
    """The epoch's shuffled order of the ids 0..n-1: the same on every rank and world size."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch)).tolist()


class GlobalCursor:
    """Where the job is in its epochs: ``epoch`` and ``consumed`` positions of that epoch's order."""

    def __init__(self, n: int, global_batch: int, seed: int = 0):
        self.n, self.global_batch, self.seed = n, global_batch, seed
        self.epoch, self.consumed = 0, 0
        self._order = (None, [])

    def order(self) -> list[int]:
        if self._order[0] != self.epoch:
            self._order = (self.epoch, epoch_order(self.n, self.epoch, self.seed))
        return self._order[1]

    def batch_for(self, rank: int, world: int) -> list[int]:
        """Rank's B/W ids of the next global batch, PAD-filled where the epoch runs out."""
        if self.global_batch % world:
            raise ValueError(f"a global batch of {self.global_batch} does not split over {world} ranks")
        per = self.global_batch // world
        block = self.order()[self.consumed:self.consumed + self.global_batch]   # the next B positions
        mine = block[rank * per:(rank + 1) * per]
        return mine + [PAD] * (per - len(mine))

    def real_in_batch(self) -> int:
        """Samples (not pads) in the next global batch: what its mean loss divides by."""
        return min(self.global_batch, self.n - self.consumed)

    def advance(self) -> None:
        """The global batch is trained: move past it (into the next epoch after the last one)."""
        self.consumed += self.real_in_batch()
        if self.consumed == self.n:
            self.epoch, self.consumed = self.epoch + 1, 0

    def steps_left(self) -> int:
        return -(-(self.n - self.consumed) // self.global_batch)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "consumed": self.consumed, "n": self.n, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        if (state["n"], state["seed"]) != (self.n, self.seed):
            raise ValueError(f"the saved cursor counts an epoch of {state['n']} samples (seed "
                             f"{state['seed']}), this run has {self.n} (seed {self.seed})")
        self.epoch, self.consumed = int(state["epoch"]), int(state["consumed"])
