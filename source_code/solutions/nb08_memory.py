"""Reference solution of notebook 08's exercise: the peak memory of a training step, predicted.

    from source_code.solutions.nb08_memory import predict_peak_bytes
"""
from __future__ import annotations


def predict_peak_bytes(n_params, layers, hidden, heads, vocab, batch, seq):
    """fp32 + AdamW, step 2: 4 (weights) + 4 (gradients) + 8 (two moments) bytes a parameter,
    plus the activations autograd saves at the start of backward."""
    state = 16 * n_params
    tokens = batch * seq
    per_block = 16 * hidden + 4 + heads          # values a token: see memory.formula.block_terms
    head = 2 * hidden + 2 + vocab                # final norm, fp32 log-softmax
    ids = 2 * 8 / 4                              # int64 input and target ids, in fp32 values
    activations = 4 * tokens * (layers * per_block + head + ids) + 8 * seq + 4
    return state + activations
