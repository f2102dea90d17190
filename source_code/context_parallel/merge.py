"""The log-sum-exp merge of two partial attention results (online softmax).

A query's attention over keys A and B, computed separately, gives (out_A, lse_A) and
(out_B, lse_B): out_X is the softmax-weighted mean of X's values, lse_X = log sum exp of X's
scores. Over A and B together:

    lse = log(exp(lse_A) + exp(lse_B))
    out = exp(lse_A - lse) * out_A + exp(lse_B - lse) * out_B

Each part is weighted by its share of the total softmax mass; a plain average would weigh a
block of 1 visible key like a block of 1000. As computed: with m = max(lse_A, lse_B),
e_X = exp(lse_X - m) <= 1 (nothing overflows), the weights are e_X / (e_A + e_B) and
lse = m + log(e_A + e_B). (Weights written exp(lse_X - lse) lose digits when lse is large:
lse itself is rounded to float32, about 6e-5 near 1000.) Shapes: out (b, h, s, d), lse (b, h, s).
"""
from __future__ import annotations

import torch


def merge(out_a, lse_a, out_b, lse_b) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) over the keys of both parts; a part given as None is not there yet."""
    if out_a is None:
        return out_b, lse_b
    m = torch.maximum(lse_a, lse_b)
    e_a, e_b = torch.exp(lse_a - m), torch.exp(lse_b - m)          # (b, h, s), each <= 1
    total = e_a + e_b
    out = (e_a / total).unsqueeze(-1) * out_a + (e_b / total).unsqueeze(-1) * out_b
    return out, m + torch.log(total)
