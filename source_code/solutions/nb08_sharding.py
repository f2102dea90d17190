"""Reference solution for the exercise of notebook 08 (sharding), checked by tests/test_sharding.py.

    python -m pytest tests/test_sharding.py -k predict_state_bytes
"""
from __future__ import annotations


def predict_state_bytes(n_params, world_size, strategy):
    """Bytes one rank keeps for parameters, gradients and AdamW state (fp32) under ``strategy``."""
    full, shard = 4 * n_params, 4 * n_params / world_size
    params = shard if strategy == "fsdp" else full
    grads = shard if strategy in ("zero2", "fsdp") else full
    optimizer = 2 * (full if strategy == "ddp" else shard)   # exp_avg + exp_avg_sq
    return {"params": params, "grads": grads, "optimizer": optimizer}
