"""Notebook 14's exercise: the send counts of the dispatch all-to-all.

You write, in the notebook::

    def send_counts(expert, keep, n_experts, world):
        ...        # expert (N, k) int64, keep (N, k) bool -> list of `world` ints

the number of rows this rank sends to each rank in the payload all-to-all of the
expert-parallel layer (rank r holds experts r*E/n ... (r+1)*E/n - 1). ``check_send_counts(fn)``
runs it on fixed routings (8 experts, top-1 and top-2, with and without capacity dropping, 2
and 4 ranks) and then on routings it draws itself, which the notebook never prints: other
numbers of experts, ranks, choices per token and tokens. It compares with the counts the
layer itself sends (``EPMoE.forward``: counted per expert, summed per rank) and prints one
line: correct, not done yet, or the first case that differs with a hint. With ``strict`` a
wrong answer raises ExerciseFailed (the tests use that). The mistakes it recognises are for
the tests (tests/test_expert_parallel.py), not for the notebook.
The reference solution is in source_code/solutions/nb14_expert_parallel.py.
"""
from __future__ import annotations

import secrets

import torch

from source_code.expert_parallel import router

FIXED = [(1, None, 2), (2, None, 2), (1, 1.0, 4), (2, 1.0, 4), (2, 0.5, 2)]  # (k, capacity factor, ranks)
DRAWN = 40                                                                 # random routings per check


class ExerciseFailed(AssertionError):
    pass


def layer_counts(expert, keep, n_experts: int, world: int) -> list:
    """What EPMoE.forward sends: per-expert counts of the kept assignments, summed per rank."""
    per_expert = router.tokens_per_expert(expert, n_experts, keep)
    return per_expert.view(world, -1).sum(1).tolist()


def routing(k: int, factor, n: int, n_experts: int, g: torch.Generator, favourite: float = 1.0):
    """(expert, keep) of n tokens routed top-k over n_experts, capacity ``factor``."""
    logits = torch.randn(n, n_experts, generator=g)
    logits[:, int(torch.randint(n_experts, (1,), generator=g))] += favourite   # drops happen
    r = router.route(logits, k, factor)
    return r.expert, r.keep


def cases(seed: int) -> list:
    """[(description, expert, keep, n_experts, world)]: the fixed cases, then DRAWN drawn ones."""
    out = []
    for i, (k, factor, world) in enumerate(FIXED):
        g = torch.Generator().manual_seed(i)
        expert, keep = routing(k, factor, 48, 8, g)
        out.append((k, factor, 48, 8, world, expert, keep))
    g = torch.Generator().manual_seed(seed)
    for _ in range(DRAWN):
        world = int(torch.randint(2, 9, (1,), generator=g))
        n_experts = world * int(torch.randint(1, 5, (1,), generator=g))
        k = int(torch.randint(1, min(n_experts, 4) + 1, (1,), generator=g))
        n = int(torch.randint(3, 97, (1,), generator=g))
        factor = [None, 0.5, 1.0, 1.25][int(torch.randint(4, (1,), generator=g))]
        expert, keep = routing(k, factor, n, n_experts, g, favourite=2.0)
        out.append((k, factor, n, n_experts, world, expert, keep))
    return [(f"top-{k}, {e} experts on {w} ranks, {n} tokens, capacity factor "
             f"{'none' if f is None else f'{f:g}'} ({int((~kp).sum())} assignments dropped)", ex, kp, e, w)
            for k, f, n, e, w, ex, kp in out]


def diagnose(got: list, expert, keep, n_experts: int, world: int) -> str:
    """A hint for a wrong answer that guides without giving it (typical mistakes recognised)."""
    per = n_experts // world
    if len(got) != world:
        if len(got) == n_experts:
            return f"you returned {len(got)} numbers, one per expert; the all-to-all takes one per rank ({world})"
        return f"you returned {len(got)} numbers; the all-to-all takes one per rank ({world})"
    if got == layer_counts(expert, torch.ones_like(keep), n_experts, world):
        return "your counts include assignments that were dropped (keep False): does anything travel for them?"
    if got == layer_counts(expert[:, :1], keep[:, :1], n_experts, world):
        return f"your counts cover the first choice only; with top-{expert.shape[1]}, what about the others?"
    if got == torch.bincount((expert[keep] % world).reshape(-1), minlength=world).tolist():
        return ("you dealt the experts out like cards (every n-th expert on the same rank); look again "
                "at which experts a rank holds")
    ranks = torch.where(keep, expert // per, -1)
    if got == [int((ranks == r).any(1).sum()) for r in range(world)]:
        return ("you counted tokens; a token whose two kept choices are on the same rank: how many "
                "expert computations does it need there, and how many rows come back?")
    if sum(got) != int(keep.sum()):
        return f"your counts add up to {sum(got)}; how many rows does this rank have to send in all?"
    return "work this case out on paper and compare with your function's steps"


def _as_ints(got, world: int) -> list:
    if isinstance(got, torch.Tensor):
        got = got.reshape(-1).tolist()
    if not isinstance(got, (list, tuple)) or not all(isinstance(v, (int, float)) and float(v).is_integer()
                                                     for v in got):
        shown = repr(got)
        raise ExerciseFailed(f"return a list of {world} integers (or a tensor of them), got "
                             f"{shown if len(shown) <= 60 else shown[:57] + '...'}")
    return [int(v) for v in got]


def check_send_counts(fn, strict: bool = False, seed: int | None = None, quiet: bool = False) -> bool:
    """Your ``send_counts(expert, keep, n_experts, world)`` against the layer's counts, on the
    fixed cases and on routings drawn from ``seed`` (None: a new draw each call). Prints one
    line (nothing with ``quiet``); True when every case matches."""
    seed = secrets.randbits(31) if seed is None else seed
    try:
        for where, expert, keep, n_experts, world in cases(seed):
            try:
                got = fn(expert.clone(), keep.clone(), n_experts, world)
            except NotImplementedError:
                raise
            except Exception as err:          # the learner's bug: one line, not a traceback here
                raise ExerciseFailed(f"{where}: your send_counts raised {type(err).__name__}: {err}") from None
            got = _as_ints(got, world)
            if got != layer_counts(expert, keep, n_experts, world):
                raise ExerciseFailed(f"{where}: you returned {got}; "
                                     + diagnose(got, expert, keep, n_experts, world))
    except NotImplementedError:
        if not quiet:
            print("not done yet: replace the TODO (raise NotImplementedError) with your code")
        if strict:
            raise ExerciseFailed("not done yet") from None
        return False
    except ExerciseFailed as failed:
        if not quiet:
            print(f"not yet: {failed}")
        if strict:
            raise
        return False
    if not quiet:
        print(f"correct: the layer's send counts in all {len(FIXED) + DRAWN} routings, {DRAWN} of them "
              "drawn just now (other experts, ranks, top-k and token counts)")
    return True
