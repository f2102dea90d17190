"""A library that reshards on resume, measured: Lightning's ``litdata`` across a change of world size.

The same stop and resume as samplers.compare (``steps`` global steps on ``before`` ranks, the rest
of the epoch on ``after`` ranks, rank r of the new world loading old rank r's state), with the
library itself: the epoch's samples written once with litdata's ``BinaryWriter`` (chunks of
``per_chunk`` samples, its shards), read by ``StreamingDataset(shuffle=True)`` through
``StreamingDataLoader``, whose ``state_dict()`` each old rank saves. litdata has no argument for
a rank: it asks ``_DistributedEnv.detect()``, which is given each rank's world size and rank here,
so that all ranks are iterated in this one process, as samplers.compare does with torch's loaders.

Each resume is counted against the same loader's epoch without a stop: on more than one rank
litdata sets ``drop_last`` when it is left unset (None, as here; an explicit False is kept, with
a warning), so every epoch leaves out the samples that do not fill the ranks' last batches
(``dropped``); a resume is exactly once when it repeats nothing and misses
exactly the samples its uninterrupted epoch drops. Without litdata installed, ``missing_note()``
says so in one line and nothing here is run.
"""
from __future__ import annotations

import importlib.util
import logging
import tempfile
from collections import Counter
from unittest import mock

PACKAGE = "litdata"


def missing_note() -> str | None:
    """None when litdata can be imported, else the one line to print instead of its measurement."""
    if importlib.util.find_spec(PACKAGE) is None:
        return ("note: litdata is not installed here, so its resume on another world size is not measured "
                "(pip install -r requirements.txt installs it)")
    return None


def write(n: int, root: str, per_chunk: int) -> str:
    """Samples 0..n-1 (each its id) in litdata's chunk files under ``root``."""
    from litdata.streaming.writer import BinaryWriter
    writer = BinaryWriter(root, chunk_size=per_chunk)
    for i in range(n):
        writer[i] = {"id": i}
    writer.done()
    writer.merge()
    return root


def _ids(root: str, world: int, rank: int, batch: int, state=None, steps=None, seed: int = 0):
    """Rank ``rank`` of ``world``: the ids it reads (``steps`` batches, else to the epoch's end)
    after loading ``state``, and its loader's state_dict() then."""
    from litdata import StreamingDataLoader, StreamingDataset
    from litdata.utilities.env import _DistributedEnv
    env = classmethod(lambda cls: _DistributedEnv(world, rank, 1))
    with mock.patch.object(_DistributedEnv, "detect", env):
        loader = StreamingDataLoader(StreamingDataset(root, shuffle=True, seed=seed), batch_size=batch,
                                     num_workers=0)
        if state is not None:
            loader.load_state_dict(state)
        ids = []
        for step, batch_ in enumerate(loader):
            ids += [int(i) for i in batch_["id"]]
            if step + 1 == steps:
                break
        return ids, loader.state_dict()


# the grid of notebook 20's loaders table (section 4): 4 ranks to 3 and 3 to 4, each with the
# per-rank and with the global batch kept
# (4 -> 3 per-rank: the global batch shrinks from 4 x 12 to 3 x 12; 3 -> 4: grows from 3 x 16 to 4 x 16)
CASES = ((4, 3, "per-rank batch kept"), (4, 3, "global batch kept"),
         (3, 4, "per-rank batch kept"), (3, 4, "global batch kept"))


def compare(n: int, steps: int, global_batch: int, cases=CASES, per_chunk: int = 128, seed: int = 0) -> list[dict]:
    """One row per (before, after, rule): the samples repeated and missing over the epoch, and what
    the same loader drops in an epoch of the resumed world's layout without a stop. ``global_batch``
    is the batch before the stop; "per-rank batch kept" keeps ``global_batch // before`` per rank."""
    logging.getLogger(PACKAGE).setLevel(logging.ERROR)      # its notes on the resume, said below instead
    root = write(n, tempfile.mkdtemp(prefix="litdata-"), per_chunk)
    rows = []
    for before, after, rule in cases:
        b_before = global_batch // before
        b_after = global_batch // after if rule == "global batch kept" else b_before
        first = [_ids(root, before, r, b_before, steps=steps, seed=seed) for r in range(before)]
        # new rank r loads old rank r's state; a new rank beyond the old world (3 -> 4: rank 3) loads
        # old rank r % before's: litdata's position is global, every old rank's state carries it
        rest = [_ids(root, after, r, b_after, state=first[r % before][1], seed=seed)[0] for r in range(after)]
        seen = Counter([i for ids, _ in first for i in ids] + [i for ids in rest for i in ids])
        whole = {i for r in range(after) for i in _ids(root, after, r, b_after, seed=seed)[0]}
        rows.append({"loader": "litdata StreamingDataLoader", "before": before, "after": after, "rule": rule,
                     "batches": (b_before * before, b_after * after), "stopped_at": steps * b_before * before,
                     "repeated": sum(c - 1 for c in seen.values()), "missing": n - len(seen),
                     "dropped": n - len(whole), "same_as_without_stop": set(seen) == whole})
    return rows
