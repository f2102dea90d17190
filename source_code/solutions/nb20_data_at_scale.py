"""Reference solution of notebook 20's exercise: the rest of an epoch from the global cursor.

    from source_code.data_at_scale.exercise import check_rank_batches
    check_rank_batches(rank_batches)
"""
from __future__ import annotations

PAD = -1


def rank_batches(n: int, consumed: int, global_batch: int, rank: int, world: int) -> list[list[int]]:
    per = global_batch // world
    batches = []
    for start in range(consumed, n, global_batch):          # one global batch a step, from the cursor
        mine = list(range(start + rank * per, min(start + (rank + 1) * per, n)))
        batches.append(mine + [PAD] * (per - len(mine)))    # the last, short batch padded
    return batches
