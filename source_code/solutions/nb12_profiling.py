"""Reference solution of notebook 12's exercise, and the broken version it starts from
(tests/test_profiling_exercise.py runs the check with both).

The check sends each function to the processes as source text and runs it with ``torch`` and
``dist`` (torch.distributed) in scope, as a notebook cell has them.
"""
import torch
import torch.distributed as dist


def global_mean_loss_broken(loss_sum, count):
    if count == 0:
        return 0.0                                   # skips the all-reduce: the other rank waits
    t = torch.tensor([loss_sum, float(count)], dtype=torch.float64)
    dist.all_reduce(t)
    return (t[0] / t[1]).item()


def global_mean_loss(loss_sum, count):
    t = torch.tensor([loss_sum, float(count)], dtype=torch.float64)
    dist.all_reduce(t)                               # every rank joins, even with count 0
    return (t[0] / t[1]).item()
