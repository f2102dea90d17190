"""The TransformerLM forward under context parallelism: this rank's tokens, ring attention.

Every rank of a context-parallel group holds the whole model (or, under tensor parallelism,
its heads and hidden units) and the same samples, but only its tokens of each sequence (the
zigzag layout of notebook 13: chunk r and chunk 2n-1-r, so causal work is balanced).
Embeddings, LayerNorms, MLPs and the head act on each token alone and run unchanged on the
rank's tokens; attention needs every earlier token's keys and values, which ring attention
passes around the group::

    tokens (b, T) -> mine (b, T/n) -> embeddings at their true positions -> blocks with
    ring attention -> logits (b, T/n, vocab) of my tokens

As notebook 13's ``model_step.cp_logits``, with the heads counted
from the projections' output (-1), as models.Attention does, so that the same forward runs
on a tensor-parallel rank's heads (DP x TP x CP).
"""
from __future__ import annotations

import functools

from source_code.context_parallel import layout as lay
from source_code.context_parallel.comm import Ring
from source_code.context_parallel.ring import ring_attention

LAYOUT = "zigzag"


def my_tokens(t, ring: Ring):
    """This rank's part of a (b, T) tensor (inputs or targets): (b, T/n)."""
    return lay.shard(t, ring.rank, ring.world, LAYOUT, dim=1)


def attention(attn, x, core):
    """models.Attention.forward with ``core(q, k, v)`` for SDPA; x (b, t, dim) -> (b, t, dim)."""
    b, t, _ = x.shape
    d = attn.wq.in_features // attn.n_heads                       # head size
    q, k, v = (w(x).view(b, t, -1, d).transpose(1, 2) for w in (attn.wq, attn.wk, attn.wv))
    return attn.wo(core(q, k, v).transpose(1, 2).reshape(b, t, -1))   # (b, heads here, t, d) inside


def cp_logits(model, tokens, ring: Ring):
    """Logits of this rank's tokens, (b, T/n, vocab); ``tokens`` is the whole (b, T)."""
    positions = lay.token_index(tokens.shape[1], ring.rank, ring.world, LAYOUT).to(tokens.device)
    core = functools.partial(ring_attention, causal=True, layout=LAYOUT, ring=ring)
    x = model.tok(my_tokens(tokens, ring)) + model.pos(positions)            # (b, T/n, dim)
    for block in model.layers:
        x = x + attention(block.attn, block.norm1(x), core)
        x = x + block.mlp(block.norm2(x))
    return model.head(model.norm(x))
