"""What the usual data loaders do across a change of world size: counted, not quoted.

The same stop and resume as the notebook's cursor drill (an epoch of n samples, ``steps`` steps
on ``before`` ranks, the rest of the epoch on ``after`` ranks), with the loaders themselves:

* "DistributedSampler, skip the steps done": ``torch.utils.data.DistributedSampler`` at the
  saved epoch (``set_epoch``) and the first ``steps`` batches of each rank skipped, as a script
  that saves its epoch and step does (notebook 07's ``ddp_fault_tolerant.py``);
* "StatefulDataLoader": torchdata's ``StatefulDataLoader`` with its
  ``StatefulDistributedSampler``, each rank's ``state_dict()`` saved, and rank r of the new
  world loading old rank r's (the only state a new rank can be given; old ranks beyond the new
  world have no one to load theirs);
* "global cursor": cursor.GlobalCursor, the notebook's.

Each is measured with the per-rank batch kept (the usual setting: a per-device batch size in
the configuration) and with the global batch kept (the per-rank batch scaled by before/after).
The ranks are iterated in this one process: each loader gets its rank and world size as
arguments, exactly what it would get from the process group (nothing else differs).
"""
from __future__ import annotations

import warnings

from torch.utils.data import DataLoader, DistributedSampler

from source_code.data_at_scale import cursor as cur


def _ids(batches) -> list[int]:
    return [int(i) for batch in batches for i in batch]


def distributed_sampler(n, before, after, steps, batch_before, batch_after, epoch=0, seed=0) -> list[int]:
    seen = []
    for world, batch, skip, take in ((before, batch_before, 0, steps), (after, batch_after, steps, None)):
        for rank in range(world):
            sampler = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=seed)
            sampler.set_epoch(epoch)
            batches = list(DataLoader(range(n), batch_size=batch, sampler=sampler))
            seen += _ids(batches[skip:None if take is None else skip + take])
    return seen


def stateful_dataloader(n, before, after, steps, batch_before, batch_after, epoch=0, seed=0) -> list[int]:
    with warnings.catch_warnings():   # torchdata 0.11 calls torch.set_vital, deprecated in torch 2.14
        warnings.filterwarnings("ignore", message=".*set_vital.*")
        return _stateful(n, before, after, steps, batch_before, batch_after, epoch, seed)


def _stateful(n, before, after, steps, batch_before, batch_after, epoch, seed) -> list[int]:
    from torchdata.stateful_dataloader import StatefulDataLoader
    from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler

    def loader(world, rank, batch):
        sampler = StatefulDistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=seed)
        sampler.set_epoch(epoch)
        return StatefulDataLoader(range(n), batch_size=batch, sampler=sampler)
    seen, saved = [], []
    for rank in range(before):
        dl = loader(before, rank, batch_before)
        it = iter(dl)
        seen += _ids(next(it) for _ in range(steps))
        saved.append(dl.state_dict())                          # what each old rank wrote to disk
    for rank in range(after):
        dl = loader(after, rank, batch_after)
        if rank < len(saved):
            dl.load_state_dict(saved[rank])
        seen += _ids(dl)
    return seen


def global_cursor(n, before, after, steps, batch_before, batch_after, epoch=0, seed=0) -> list[int]:
    c = cur.GlobalCursor(n, batch_before * before, seed)
    c.epoch = epoch
    seen = []
    for world, batch, take in ((before, batch_before, steps), (after, batch_after, None)):
        c.global_batch = batch * world           # the cursor counts samples: any global batch resumes
        while c.epoch == epoch and take != 0:
            seen += [i for r in range(world) for i in c.batch_for(r, world) if i != cur.PAD]
            c.advance()
            take = None if take is None else take - 1
    return seen


LOADERS = {"DistributedSampler, skip the steps done": distributed_sampler,
           "torchdata StatefulDataLoader": stateful_dataloader,
           "global cursor": global_cursor}


def compare(n: int, before: int, after: int, steps: int, per_rank_batch: int) -> list[dict]:
    """One row per loader and batch rule: samples seen, repeated and missing over the epoch,
    and the repeats the same loader makes in an epoch without any stop (its padding)."""
    from source_code.data_at_scale.drills import count
    rows = []
    for rule, after_batch in (("per-rank batch kept", per_rank_batch),
                              ("global batch kept", per_rank_batch * before // after)):
        for name, fn in LOADERS.items():
            got = count(fn(n, before, after, steps, per_rank_batch, after_batch), n)
            plain = count(fn(n, before, before, 0, per_rank_batch, per_rank_batch), n)
            rows.append({"loader": name, "rule": rule, **got, "padding_repeats": plain["repeated"]})
    return rows
