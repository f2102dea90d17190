"""Notebook 20's exercise: the rest of an epoch from the global cursor, on a new world size.

The learner writes ``rank_batches(n, consumed, global_batch, rank, world)``: the batches that
rank ``rank`` of ``world`` trains from the cursor to the end of the epoch, each a list of
positions of the epoch's shuffled order (0..n-1), with ``PAD`` (-1) for an empty slot.
``check_rank_batches(fn)`` runs it for every rank of configurations the notebook never prints
and accepts an answer when, on every configuration:
* every rank makes the same number of steps, each step ``global_batch // world`` slots;
* every position from ``consumed`` to ``n - 1`` is trained exactly once, none before ``consumed``;
* no step is all PAD on every rank (a stop at the epoch's end leaves no step at all);
* step s of the ranks together trains the global batch that a run that never stopped trains
  at that point of the epoch (a job stops between steps, so the cursor is a whole number of
  global batches), in whatever split among the ranks, with the pads in the last step only.
It returns one line: "correct: ..." or what is wrong (it never raises through the cell).
"""
from __future__ import annotations

PAD = -1
# (n, consumed, global batch, world), the cursor a whole number of global batches: a fresh
# epoch on 8 ranks, an epoch that does not divide the batch, one global batch left with most
# slots empty, a batch of one sample per rank, one rank, an odd world size with one sample
# left, a stop right before the epoch's end, a stop at the epoch's very end (nothing left)
CASES = [(1000, 0, 40, 8), (997, 324, 36, 6), (50, 48, 16, 4), (23, 8, 4, 4), (96, 24, 24, 1),
         (7, 6, 6, 3), (1210, 1200, 48, 2), (48, 48, 16, 4)]


def _run(fn, n, consumed, batch, world):
    return [[[int(p) for p in step] for step in fn(n, consumed, batch, rank, world)] for rank in range(world)]


def problem(per_rank: list[list[list[int]]], n: int, consumed: int, batch: int, world: int) -> str:
    """'' when the ranks' batches are right for this configuration, else what is wrong."""
    steps = {len(r) for r in per_rank}
    if len(steps) != 1:
        return (f"the ranks make different numbers of steps ({sorted(len(r) for r in per_rank)}): the ranks "
                "that finish first leave the others waiting in DDP's all-reduce (section 3)")
    per = batch // world
    if any(len(step) != per for r in per_rank for step in r):
        return f"each rank's batch must have global_batch // world = {per} slots in every step (PAD for an empty one)"
    flat = [p for r in per_rank for step in r for p in step if p != PAD]
    if any(p < consumed for p in flat):
        return "positions before the cursor come again: they were trained before the stop"
    if any(p >= n for p in flat):
        return f"positions past the epoch's end (the last is {n - 1}): use PAD for an empty slot"
    if len(flat) != len(set(flat)):
        return "a position is trained twice in the rest of the epoch"
    left = set(range(consumed, n)) - set(flat)
    if left:
        last = n - (n - consumed) % batch if (n - consumed) % batch else None
        if last is not None and left == set(range(last, n)):
            return "the epoch's last, short global batch is left out: its samples are never trained (pad it)"
        return f"{len(left)} positions of the rest of the epoch are never trained"
    for s in range(steps.pop()):
        got = sorted(p for r in per_rank for p in r[s] if p != PAD)
        if not got:
            return (f"step {s} trains no sample on any rank (every slot PAD): a step costs a forward, a "
                    "backward and an all-reduce; the rest of the epoch needs no more steps than its samples fill")
        want = list(range(consumed + s * batch, min(n, consumed + (s + 1) * batch)))
        if got != want:
            return (f"every sample once, but step {s} trains other positions than the global batch a run "
                    "without the stop trains there")
    return ""


def check_rank_batches(fn) -> str:
    for n, consumed, batch, world in CASES:
        try:
            per_rank = _run(fn, n, consumed, batch, world)
        except NotImplementedError:
            return "not done yet: write rank_batches, then run this cell again"
        except Exception as exc:  # noqa: BLE001 - the learner's error, said in one line
            return f"rank_batches raised {type(exc).__name__}: {exc}"
        wrong = problem(per_rank, n, consumed, batch, world)
        if wrong:
            return f"not yet, with {n} samples, the cursor at {consumed}, a global batch of {batch} on {world} ranks: {wrong}"
    return (f"correct: on {len(CASES)} configurations every rank makes the same steps and the rest of the "
            "epoch is trained exactly once, in the global batches of a run that never stopped")
