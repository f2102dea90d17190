"""The TransformerLM forward under context parallelism: this rank's tokens, ring attention.

Every rank of a context-parallel group holds the whole model and the same samples, but only
its tokens of each sequence (the zigzag layout of notebook 13: chunk r and chunk 2n-1-r, so
causal work is balanced). Embeddings, LayerNorms, MLPs and the head act on each token alone
and run unchanged on the rank's tokens; attention needs every earlier token's keys and
values, which ring attention passes around the group::

    tokens (b, T) -> mine (b, T/n) -> embeddings at their true positions -> blocks with
    ring attention -> logits (b, T/n, vocab) of my tokens

The gradients of a rank cover its tokens only: they must be SUMMED over the group (and over
the data-parallel group), the loss of each rank being its summed cross-entropy / the global
number of valid targets.
"""
from __future__ import annotations

import functools

from source_code.context_parallel import layout as lay
from source_code.context_parallel.comm import Ring
from source_code.context_parallel import model_step
from source_code.context_parallel.ring import ring_attention

LAYOUT = "zigzag"


def my_tokens(t, ring: Ring):
    """This rank's part of a (b, T) tensor (inputs or targets): (b, T/n)."""
    return lay.shard(t, ring.rank, ring.world, LAYOUT, dim=1)


def cp_logits(model, tokens, ring: Ring):
    """Logits of this rank's tokens, (b, T/n, vocab); ``tokens`` is the whole (b, T)."""
    positions = lay.token_index(tokens.shape[1], ring.rank, ring.world, LAYOUT).to(tokens.device)
    core = functools.partial(ring_attention, causal=True, layout=LAYOUT, ring=ring)
    return model_step.cp_logits(model, my_tokens(tokens, ring), positions, core)   # notebook 13's
