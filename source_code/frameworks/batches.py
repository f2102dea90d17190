"""Which examples each process trains on, step by step: the plain script's DistributedSampler
against the loader that Accelerate's ``prepare`` makes of a shuffled DataLoader.

    from source_code.frameworks import batches
    plain = batches.plain_batches(1438, 64, 2, seed=0, epochs=1)        # [epoch][rank][step] -> indices
    accel = batches.accelerate_batches(1438, 64, 2, seed=0, epochs=1)
    batches.compare(plain, accel)                                       # a dict of counts

Both give every process B/N examples a step. They differ (accelerate/data_loader.py,
``prepare_data_loader`` and ``BatchSamplerShard``):

* the order: DistributedSampler draws a permutation from a generator seeded with seed + epoch
  (``set_epoch``) and deals it out index by index (process r takes positions r, r+N, ...).
  Accelerate keeps the loader's own ``RandomSampler`` (its generator seeded once and carried on
  from epoch to epoch, synchronised from process 0 when each epoch starts) and deals out whole
  batches of B/N (``BatchSamplerShard``: process r takes batches r, r+N, ...);
* the end of an epoch: DistributedSampler's last step is short (the examples left over);
  Accelerate (``even_batches=True``) fills it up with examples from the start of the epoch, so
  every process takes full batches and some examples are seen twice in that epoch.

``accelerate_batches`` calls accelerate's own ``prepare_data_loader`` with the settings of a
default ``Accelerator`` (read from ``DataLoaderConfiguration()``), once per process index, in
this one process: without a process group there is no generator to synchronise, and none is
needed, since every process seeds its loader's generator the same way.
"""
from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def _indices(n: int) -> TensorDataset:
    return TensorDataset(torch.arange(n))        # a dataset of n examples that are their index


def plain_batches(n: int, batch_size: int, world: int, seed: int, epochs: int = 1) -> list:
    """[epoch][rank][step] -> the example indices the plain script (and Lightning, DeepSpeed) use."""
    out = []
    for epoch in range(epochs):
        per_rank = []
        for rank in range(world):
            sampler = DistributedSampler(_indices(n), num_replicas=world, rank=rank, shuffle=True, seed=seed)
            sampler.set_epoch(epoch)
            loader = DataLoader(_indices(n), batch_size=batch_size // world, sampler=sampler)
            per_rank.append([b[0].tolist() for b in loader])
        out.append(per_rank)
    return out


def accelerate_batches(n: int, batch_size: int, world: int, seed: int, epochs: int = 1) -> list:
    """[epoch][rank][step] -> the indices Accelerate's prepared loader gives each process, for the
    loader of source_code/frameworks/accelerate_train.py (shuffled, its generator seeded)."""
    from accelerate import DataLoaderConfiguration
    from accelerate.data_loader import prepare_data_loader
    cfg = DataLoaderConfiguration()
    loaders = []
    for rank in range(world):
        plain = DataLoader(_indices(n), batch_size=batch_size // world, shuffle=True,
                           generator=torch.Generator().manual_seed(seed))
        loaders.append(prepare_data_loader(
            plain, num_processes=world, process_index=rank, split_batches=cfg.split_batches,
            put_on_device=False, rng_types=None, dispatch_batches=cfg.dispatch_batches,
            even_batches=cfg.even_batches, use_seedable_sampler=cfg.use_seedable_sampler))
    return [[[b[0].tolist() for b in loader] for loader in loaders] for _ in range(epochs)]


def compare(plain: list, accel: list) -> dict:
    """Counts over all epochs: steps per process, examples per epoch, examples seen twice in an
    epoch, the last step's global batch, and the steps whose global batch is the same set."""
    def global_steps(epoch):
        return [sorted(i for rank in epoch for i in rank[s]) for s in range(len(epoch[0]))]

    out = {}
    for name, runs in (("plain", plain), ("accelerate", accel)):
        epochs = [global_steps(e) for e in runs]
        out[name] = {"steps_per_epoch": {len(r) for e in runs for r in e},
                     "examples_per_epoch": {sum(len(s) for s in e) for e in epochs},
                     "distinct_per_epoch": {len({i for s in e for i in s}) for e in epochs},
                     "last_step": {len(e[-1]) for e in epochs}}
    same = [a == b for ep, ea in zip(plain, accel) for a, b in zip(global_steps(ep), global_steps(ea))]
    out["same_global_batches"], out["steps"] = sum(same), len(same)
    return out
