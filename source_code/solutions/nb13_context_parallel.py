"""Reference solution of notebook 13's exercise: the log-sum-exp merge and the causal choice of
a ring step (tests/test_context_parallel_exercise.py runs the check with it and wrong answers)."""
from __future__ import annotations

import torch


def reference_merge(out_a, lse_a, out_b, lse_b):
    m = torch.maximum(lse_a, lse_b)                              # subtract the larger: no overflow
    e_a, e_b = torch.exp(lse_a - m), torch.exp(lse_b - m)        # each part's softmax mass / e^m
    total = e_a + e_b
    out = (e_a / total).unsqueeze(-1) * out_a + (e_b / total).unsqueeze(-1) * out_b
    return out, m + torch.log(total)                             # each part weighted by its mass


def reference_block_kind(q_chunk, k_chunk, causal):
    if not causal or k_chunk < q_chunk:
        return "full"                                            # every key before every query
    return "diagonal" if k_chunk == q_chunk else "skip"          # same chunk: lower triangle
