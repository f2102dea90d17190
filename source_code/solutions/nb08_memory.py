"""Reference solution of notebook 08's exercise: the peak memory of a training step, predicted.

    from source_code.solutions.nb08_memory import predict_peak_bytes
"""
from __future__ import annotations

STATE_BYTES = {"fp32": 4 + 4 + 8,              # weights, gradients, AdamW's two moments
               "bf16-mixed": 2 + 2 + 4 + 4 + 4}  # bf16 weights and gradients; fp32 master + moments
VALUE_BYTES = {"fp32": 4, "bf16-mixed": 2}     # an activation value in the model's dtype


def predict_peak_bytes(cfg: dict) -> float:
    """The state (bytes per parameter), plus what autograd keeps at the start of backward."""
    n, h, a, vocab = cfg["n_params"], cfg["hidden"], cfg["heads"], cfg["vocab"]
    v = VALUE_BYTES[cfg["precision"]]
    tokens = cfg["batch"] * cfg["seq"]
    per_block = v * (16 * h + 4) + 4 * a        # memory.formula.block_terms; log-sum-exp in fp32
    head = v * (2 * h + 2) + 4 * vocab + 2 * 8  # final norm, fp32 log-softmax, int64 input and target ids
    other = 8 * cfg["seq"] + 4                  # int64 positions, the loss's fp32 weight
    return STATE_BYTES[cfg["precision"]] * n + tokens * (cfg["layers"] * per_block + head) + other
