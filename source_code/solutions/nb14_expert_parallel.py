"""Reference solution of notebook 14's exercise: the send counts of the dispatch all-to-all.

    from source_code.expert_parallel.exercises import check_send_counts
    check_send_counts(reference_send_counts)
"""
from __future__ import annotations

import torch


def reference_send_counts(expert: torch.Tensor, keep: torch.Tensor, n_experts: int, world: int) -> list:
    per_rank = n_experts // world                        # experts per rank, contiguous blocks
    rank_of = expert[keep] // per_rank                   # (kept assignments,) destination rank
    return torch.bincount(rank_of, minlength=world).tolist()
