"""Reference solution for the exercise of notebook 09 (sharding), checked by tests/test_sharding.py.

    python -m pytest tests/test_sharding.py -k exercise
"""
from __future__ import annotations

# bytes per parameter in bf16 mixed precision with AdamW: bf16 weights and gradients; the
# optimizer holds the fp32 master weights, exp_avg and exp_avg_sq
BYTES = {"params": 2, "grads": 2, "optimizer": 4 + 4 + 4}
SHARDED = {"ddp": (), "zero1": ("optimizer",), "zero2": ("optimizer", "grads"),
           "fsdp": ("optimizer", "grads", "params")}


def predict_bf16_state_bytes(n_params, world_size, strategy):
    """Bytes one rank keeps for parameters, gradients and optimizer state under ``strategy``."""
    return {key: per * (n_params / world_size if key in SHARDED[strategy] else n_params)
            for key, per in BYTES.items()}
