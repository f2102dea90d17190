"""Notebook 14's exercise: the send counts of the dispatch all-to-all.

You write, in the notebook::

    def send_counts(expert, keep, n_experts, world):
        ...        # expert (N, k) int64, keep (N, k) bool -> list of `world` ints

the number of rows this rank sends to each rank in the payload all-to-all: one row per KEPT
assignment (a token with two choices on the same rank is sent twice: each expert needs its
copy, and the two results come back separately), to the rank that holds the expert; rank r
holds experts r*E/n ... (r+1)*E/n - 1. ``check_send_counts(send_counts)`` runs it on routings
of top-1 and top-2, with and without capacity dropping, for 2 and 4 ranks, compares with the
counts the expert-parallel layer uses, and names the typical mistake when it differs.
The reference solution is in source_code/solutions/nb14_expert_parallel.py.
"""
from __future__ import annotations

import torch

from source_code.expert_parallel import router

CASES = [(1, None, 2), (2, None, 2), (1, 1.0, 4), (2, 1.0, 4), (2, 0.5, 2)]  # (k, capacity factor, ranks)


def _expected(expert, keep, n_experts: int, world: int) -> list:
    """What EPMoE.forward computes: per-expert counts of the kept assignments, summed per rank."""
    per_expert = router.tokens_per_expert(expert, n_experts, keep)
    return per_expert.view(world, -1).sum(1).tolist()


def _routing(k: int, factor, seed: int, n: int = 48, n_experts: int = 8):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, n_experts, generator=g)
    logits[:, 0] += 1.0                                   # a favourite expert: drops happen
    r = router.route(logits, k, factor)
    return r.expert, r.keep


def _diagnose(got, expert, keep, n_experts: int, world: int) -> str:
    per = n_experts // world
    as_list = lambda t: t.tolist() if isinstance(t, torch.Tensor) else list(t)   # noqa: E731
    if len(got) == n_experts and n_experts != world:
        return (f"you returned {len(got)} numbers, one per expert; the all-to-all needs one per "
                f"RANK ({world}). Hint: rank r holds experts r*E/n ... (r+1)*E/n - 1")
    if len(got) != world:
        return f"you returned {len(got)} numbers; the all-to-all needs one per rank ({world})"
    if got == _expected(expert, torch.ones_like(keep), n_experts, world):
        return ("your counts include the dropped assignments. Hint: an assignment over capacity "
                "(keep False) is not sent anywhere")
    if got == torch.bincount(expert[:, 0][keep[:, 0]] // per, minlength=world).tolist():
        return "you counted only the first choice. Hint: every kept choice is a row to send"
    rr = torch.bincount((expert[keep] % world).reshape(-1), minlength=world).tolist()
    if got == rr:
        return ("you placed expert e on rank e % n (round robin); here a rank holds a contiguous "
                "block: expert e lives on rank e // (E/n)")
    ranks = torch.where(keep, expert // per, -1)
    once = [int(((ranks == r).any(1)).sum()) for r in range(world)]
    if got == once:
        return ("you counted tokens, not assignments: a token whose two choices live on the same "
                "rank is sent twice (each expert needs its own copy)")
    return f"expected {_expected(expert, keep, n_experts, world)}, got {as_list(got)}"


def check_send_counts(fn) -> str:
    """Your ``send_counts(expert, keep, n_experts, world)`` against the layer's counts."""
    for i, (k, factor, world) in enumerate(CASES):
        expert, keep = _routing(k, factor, seed=i)
        try:
            got = fn(expert.clone(), keep.clone(), 8, world)
        except NotImplementedError:
            got = None
        if got is None:
            raise NotImplementedError("exercise not done yet: fill in the TODO, then run this cell again")
        got = [int(v) for v in (got.tolist() if isinstance(got, torch.Tensor) else got)]
        want = _expected(expert, keep, 8, world)
        if got != want:
            where = f"top-{k}, capacity factor {factor}, {world} ranks"
            raise AssertionError(f"{where}: {_diagnose(got, expert, keep, 8, world)}")
    msg = (f"correct: the send counts equal the layer's in all {len(CASES)} routings (top-1 and "
           "top-2, with and without dropping, 2 and 4 ranks)")
    print(msg)
    return msg
