"""Shuffling shards: how far a shard-level, a buffer and a global shuffle are from random, and
what each does to the loss on the sort task.

The shards hold samples alike (formats.py stores them in the order of their tokens' mean), as
a dataset written by class, source or date does. Three orders of one epoch:
* "shards shuffled": WebDataset reads the shards in a shuffled order, each front to back;
* "shards + buffer": the same stream through WebDataset's ``shuffle`` buffer of ``bufsize``
  samples (a random one of the buffer goes out as each new one comes in);
* "global": one permutation of every sample (cursor.epoch_order): random access (the array or
  Arrow file of formats.py, or shards read into memory).

The statistic: the fraction of the pairs of samples in a batch that come from the same shard,
against the same fraction for a random batch (sum of s(s-1) over shards of s samples, over
n(n-1)); 1x is random. The loss: the same model from the same weights, one epoch in each
order, evaluated on a held-out set drawn from every shard's kind of sample.
"""
from __future__ import annotations

import random
import warnings

import numpy as np
import torch

from source_code.data_at_scale import cursor as cur, model as mdl

ORDERS = ("shards shuffled", "shards + buffer", "global")


def stream(kind: str, urls: list[str], n: int, seed: int, bufsize: int = 100) -> list[int]:
    """The ids of one epoch in the order ``kind`` reads them."""
    if kind == "global":
        return cur.epoch_order(n, 0, seed)
    import webdataset as wds
    stages = [wds.SimpleShardList(urls, seed=seed), wds.tarfile_to_samples()]
    if kind == "shards + buffer":
        stages.append(wds.shuffle(bufsize, initial=bufsize, rng=random.Random(seed)))
    with warnings.catch_warnings():   # WebDataset leaves its tar streams to the garbage collector
        warnings.simplefilter("ignore", ResourceWarning)
        return [int(s["__key__"]) for s in wds.DataPipeline(*stages)]


def same_shard_pairs(ids: list[int], shard_of: dict[int, int], batch: int) -> float:
    """Mean over full batches of the fraction of their sample pairs that share a shard."""
    fractions = []
    for start in range(0, len(ids) - batch + 1, batch):
        counts = np.bincount([shard_of[i] for i in ids[start:start + batch]])
        fractions.append((counts * (counts - 1)).sum() / (batch * (batch - 1)))
    return float(np.mean(fractions))


def random_pairs(shard_sizes: list[int]) -> float:
    """The same fraction for batches drawn at random from the whole dataset."""
    n = sum(shard_sizes)
    return sum(s * (s - 1) for s in shard_sizes) / (n * (n - 1))


def train(ids: list[int], samples: np.ndarray, held_out: np.ndarray, batch: int, seed: int,
          every: int = 10) -> list[tuple[int, float]]:
    """One epoch in the order ``ids`` from the same initial weights: [(step, held-out loss)]."""
    torch.manual_seed(seed)
    model = mdl.build(seed=seed)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    curve = [(0, mdl.eval_loss(model, held_out))]
    for step, start in enumerate(range(0, len(ids) - batch + 1, batch), 1):
        x, y, w = mdl.collate(samples, ids[start:start + batch])
        loss = mdl.weighted_loss(model, x, y, w)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % every == 0 or start + 2 * batch > len(ids):
            curve.append((step, mdl.eval_loss(model, held_out)))
    return curve


def compare(urls, samples: np.ndarray, held_out: np.ndarray, shards: list[list[int]], batch: int,
            seed: int) -> dict:
    """For one seed: each order's same-shard statistic and loss curve."""
    torch.set_num_threads(1)
    shard_of = {i: k for k, shard in enumerate(shards) for i in shard}
    out = {}
    for kind in ORDERS:
        ids = stream(kind, urls, len(samples), seed)
        out[kind] = {"pairs": same_shard_pairs(ids, shard_of, batch),
                     "curve": train(ids, samples, held_out, batch, seed)}
    return out
