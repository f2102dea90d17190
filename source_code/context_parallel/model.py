"""A TransformerLM block (source_code/models.py) with its attention core exchangeable: full
SDPA, a naive softmax that holds the (t x t) scores, or ring attention on this rank's tokens.

Only the core changes: q/k/v/o projections, LayerNorms and MLP act on each token alone, so
under context parallelism they run unchanged on the rank's t/n tokens.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from source_code import models


def sdpa(q, k, v, causal: bool = True):
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def naive(q, k, v, causal: bool = True):
    """softmax(q k^T / sqrt(d)) v with the scores materialised: (b, h, t, t) kept for backward."""
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if causal:
        keep = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def attention_forward(attn: models.Attention, x, core):
    """models.Attention.forward with ``core(q, k, v)`` in place of SDPA; x (b, t, dim)."""
    b, t, _ = x.shape
    q, k, v = (w(x).view(b, t, attn.n_heads, -1).transpose(1, 2) for w in (attn.wq, attn.wk, attn.wv))
    y = core(q, k, v)                                          # (b, h, t, d)
    return attn.wo(y.transpose(1, 2).reshape(b, t, -1))


def block_forward(block: models.Block, x, core):
    """models.Block.forward with the attention core exchanged."""
    x = x + attention_forward(block.attn, block.norm1(x), core)
    return x + block.mlp(block.norm2(x))
