"""The log-sum-exp merge of two partial attention results (online softmax).

A query's attention over keys A and B, computed separately, gives (out_A, lse_A) and
(out_B, lse_B): out_X is the softmax-weighted mean of X's values, lse_X = log sum exp of X's
scores. Over A and B together:

    lse = log(exp(lse_A) + exp(lse_B))          computed as m + log(exp(lse_A - m) + exp(lse_B - m)),
                                                m = max(lse_A, lse_B), so nothing overflows
    out = exp(lse_A - lse) * out_A + exp(lse_B - lse) * out_B

Each part is weighted by its share of the total softmax mass; a plain average would weigh a
block of 1 visible key like a block of 1000. Shapes: out (b, h, s, d), lse (b, h, s).
"""
from __future__ import annotations

import torch


def merge(out_a, lse_a, out_b, lse_b) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) over the keys of both parts; a part given as None is not there yet."""
    if out_a is None:
        return out_b, lse_b
    m = torch.maximum(lse_a, lse_b)
    lse = m + torch.log(torch.exp(lse_a - m) + torch.exp(lse_b - m))
    out = torch.exp(lse_a - lse).unsqueeze(-1) * out_a + torch.exp(lse_b - lse).unsqueeze(-1) * out_b
    return out, lse
