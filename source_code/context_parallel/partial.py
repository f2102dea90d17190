"""Attention of one query chunk against one key/value chunk: the unit of work of ring attention.

Forward returns the chunk's output AND its log-sum-exp (lse) per query, the two numbers that
let partial results over different key chunks be combined exactly (merge.py). Backward is the
flash-attention backward: given the FINAL output and lse of the query (over all key chunks),
the probabilities of this chunk's keys are exp(scores - lse) and the gradients follow without
ever holding a (T x T) matrix.

Shapes: q (b, h, s_q, d); k, v (b, h, s_k, d); out (b, h, s_q, d); lse (b, h, s_q).
``diagonal``: query and key chunk are the same chunk of the sequence, so the causal mask keeps
the lower triangle (key position <= query position); other chunks are all-visible or skipped.
"""
from __future__ import annotations

import torch


def scores(q, k, scale: float, diagonal: bool) -> torch.Tensor:
    """Scaled scores of q against this key chunk; -inf where a diagonal block's mask hides a key."""
    s = (q @ k.transpose(-2, -1)) * scale                      # (b, h, s_q, s_k)
    if diagonal:
        keep = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    return s


def attend(q, k, v, scale: float, diagonal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of q against this key chunk only."""
    s = scores(q, k, scale, diagonal)
    lse = torch.logsumexp(s, dim=-1)                           # (b, h, s_q)
    return torch.exp(s - lse.unsqueeze(-1)) @ v, lse


def attend_backward(q, k, v, out, lse, dout, scale: float, diagonal: bool):
    """(dq, dk, dv) contributions of this key chunk; ``out``/``lse`` are the final ones."""
    p = torch.exp(scores(q, k, scale, diagonal) - lse.unsqueeze(-1))   # true probabilities
    dv = p.transpose(-2, -1) @ dout
    dp = dout @ v.transpose(-2, -1)
    delta = (dout * out).sum(-1, keepdim=True)                 # sum_j p_ij dp_ij, per query
    ds = p * (dp - delta)                                      # softmax backward
    return (ds @ k) * scale, (ds.transpose(-2, -1) @ q) * scale, dv
