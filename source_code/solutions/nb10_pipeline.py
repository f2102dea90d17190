"""Reference solution for the exercise of notebook 10 (pipeline parallelism), checked by
tests/test_pipeline_exercise.py.

    python -m pytest tests/test_pipeline_exercise.py
"""
from __future__ import annotations


def one_f_one_b(p, m, s):
    """Stage s's 1F1B order: warm-up forwards, then forward/backward pairs, then cool-down backwards."""
    warmup = min(p - s - 1, m)        # the last stage needs none: its first backward can start at once
    order = [("F", i) for i in range(warmup)]
    for k in range(m - warmup):       # steady state: forward of microbatch warmup+k, backward of k
        order.append(("F", warmup + k))
        order.append(("B", k))
    order += [("B", i) for i in range(m - warmup, m)]
    return order
