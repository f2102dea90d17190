"""Check functions for the exercises of notebook 05 (solutions: source_code/solutions/nb05_ddp.py).

    from source_code.ddp_internals.exercises import check_shard, check_average_gradients
    check_shard(my_shard)                        # (a) shard a dataset like DistributedSampler
    check_average_gradients(my_average_gradients)  # (b) the all-reduce step of a naive DDP

Each check raises AssertionError with a hint when the answer is wrong and returns a short
summary when it is right. (b) runs the function in 2 real processes (gloo): a function defined
in a notebook cell cannot be pickled, so its source code is sent and executed there.
"""
from __future__ import annotations

import inspect
import textwrap

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data.distributed import DistributedSampler

SHARD_CASES = [(10, 3), (7, 4), (1438, 2), (64, 4)]  # (dataset length, world size)


def check_shard(shard) -> str:
    """``shard(n, world_size, rank, epoch, seed)`` must return DistributedSampler's indices."""
    try:
        shard(10, 2, 0, 0, 0)
    except NotImplementedError:
        raise NotImplementedError("exercise (a) not done yet: fill in shard, then run this cell again") from None
    checked = 0
    for n, world in SHARD_CASES:
        for epoch in (0, 1):
            for seed in (0, 5):
                for rank in range(world):
                    sampler = DistributedSampler(range(n), num_replicas=world, rank=rank,
                                                 shuffle=True, seed=seed)
                    sampler.set_epoch(epoch)
                    want = list(sampler)
                    got = [int(i) for i in shard(n, world, rank, epoch, seed)]
                    assert got == want, (
                        f"shard(n={n}, world_size={world}, rank={rank}, epoch={epoch}, seed={seed}) "
                        f"gave {got[:8]}{'...' if len(got) > 8 else ''} (length {len(got)}), "
                        f"DistributedSampler gives {want[:8]}{'...' if len(want) > 8 else ''} "
                        f"(length {len(want)}). Hint: shuffle with torch.randperm(n, generator="
                        f"torch.Generator().manual_seed(seed + epoch)), pad to a multiple of "
                        f"world_size by repeating the start, then take order[rank::world_size]")
                    checked += 1
    msg = f"correct: shard matches DistributedSampler in all {checked} cases"
    print(msg)
    return msg


def _reference_and_learner(source: str, name: str) -> float:
    """On every rank: the learner's averaged gradient vs the full-batch gradient; max |diff|."""
    namespace = {"torch": torch, "dist": dist, "nn": nn}
    exec(compile(source, f"<{name}>", "exec"), namespace)
    average_gradients = namespace[name]
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    x, y = torch.randn(8 * world, 5), torch.randint(0, 3, (8 * world,))
    reference = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 3))
    model = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 3))
    model.load_state_dict(reference.state_dict())
    F.cross_entropy(reference(x), y).backward()  # the gradient of the whole global batch
    mine = slice(8 * rank, 8 * (rank + 1))
    F.cross_entropy(model(x[mine]), y[mine]).backward()  # this rank's shard only
    average_gradients(model)
    return max((p.grad - q.grad).abs().max().item()
               for p, q in zip(model.parameters(), reference.parameters()))


def check_average_gradients(average_gradients, world_size: int = 2, tol: float = 1e-6) -> str:
    """``average_gradients(model)`` must turn each rank's gradients into the mean over ranks."""
    from source_code.processes import ProcessesFailed, spawn
    try:
        source = textwrap.dedent(inspect.getsource(average_gradients))
    except (OSError, TypeError):
        raise ValueError("cannot read the source of average_gradients: define it with `def` in a "
                         "notebook cell or a .py file (it runs in other processes, where only "
                         "torch, dist and nn are imported)") from None
    if "raise NotImplementedError" in source:
        raise NotImplementedError("exercise (b) not done yet: fill in average_gradients, then run this cell again")
    try:
        diffs = spawn(_reference_and_learner, world_size, source, average_gradients.__name__)
    except ProcessesFailed as err:  # show the learner's own error, not the plumbing around it
        lines = [ln for ln in str(err).splitlines() if ln.strip()]
        raise AssertionError(f"average_gradients raised an error on a rank: {lines[-1]}") from None
    worst = max(diffs)
    assert worst <= tol, (
        f"after average_gradients the gradients differ from the full-batch gradient by {worst:.3g} "
        f"(ranks: {', '.join(f'{d:.3g}' for d in diffs)}). Hint: dist.all_reduce(p.grad, "
        f"op=dist.ReduceOp.SUM) sums over ranks; divide by dist.get_world_size() to average")
    msg = f"correct: averaged gradients equal the full-batch gradient on {world_size} ranks (max diff {worst:.1e})"
    print(msg)
    return msg
