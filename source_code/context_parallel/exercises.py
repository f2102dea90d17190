"""Notebook 13's exercise: the log-sum-exp merge and the causal choice of one ring step.

You write, in the notebook::

    def merge(out_a, lse_a, out_b, lse_b):     # -> (out, lse) over the keys of both parts
        ...
    def block_kind(q_chunk, k_chunk, causal):  # -> "full", "diagonal" or "skip"
        ...

``check_ring_step(merge, block_kind)`` first tries ``merge`` on two halves of the keys of a
random attention (also with scores near 1000, where exp() overflows in fp32 unless the
larger lse is subtracted first), then ``block_kind`` on every pair of chunks, then runs a
whole zigzag ring attention with both on 2 and 4 simulated ranks (one process: rank r's step
s uses the K/V chunks of rank (r - s) mod n, as the ring would deliver them) against full
attention. A wrong answer raises AssertionError with a hint. The reference solution is in
source_code/solutions/nb13_context_parallel.py.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from source_code.context_parallel.layout import chunk_ids
from source_code.context_parallel.partial import attend

KINDS = ("full", "diagonal", "skip")


def _expected_kind(q_chunk: int, k_chunk: int, causal: bool) -> str:
    if not causal or k_chunk < q_chunk:
        return "full"
    return "diagonal" if k_chunk == q_chunk else "skip"


def _close(a, b, tol: float = 1e-5) -> bool:
    return (a is not None and torch.is_tensor(a) and a.shape == b.shape
            and bool(torch.isfinite(a).all()) and (a - b).abs().max().item() <= tol)


def _halves(seed: int, scale: float = 1.0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 2, 6, 4, generator=g) for _ in range(3))
    q = q * scale
    sm = 1.0 / math.sqrt(q.shape[-1])
    full = (F.scaled_dot_product_attention(q.double(), k.double(), v.double()).float(),
            torch.logsumexp((q.double() @ k.double().transpose(-2, -1)) * sm, -1).float())
    a = attend(q, k[:, :, :2], v[:, :, :2], sm, False)      # 2 keys in one part, 4 in the other
    b = attend(q, k[:, :, 2:], v[:, :, 2:], sm, False)
    return a, b, full


def _check_merge(merge) -> None:
    (oa, la), (ob, lb), (out, lse) = _halves(0)
    try:
        got = merge(oa, la, ob, lb)
    except NotImplementedError:
        raise NotImplementedError("exercise not done yet: fill in the TODOs, then run this cell again") from None
    if not (isinstance(got, tuple) and len(got) == 2):
        raise AssertionError("merge must return a pair (out, lse)")
    if not _close(got[0], out):
        if _close(got[0], (oa + ob) / 2):
            raise AssertionError("merge: a plain average of the two outputs. Hint: a part whose "
                                 "keys hold most of the softmax mass must count more; how much "
                                 "mass does each part have, in terms of its lse?")
        raise AssertionError("merge: the output differs from attention over all keys. Hint: "
                             "weigh each part by exp(its lse - the merged lse)")
    if not _close(got[1], lse):
        raise AssertionError("merge: the output is right but the returned lse is not the "
                             "log-sum-exp over both parts; the next merge of the ring needs it")
    (oa, la), (ob, lb), (out, lse) = _halves(1, scale=300.0)  # scores, and lse, near 1000
    got = merge(oa, la, ob, lb)
    if not (torch.isfinite(got[0]).all() and torch.isfinite(got[1]).all()):
        raise AssertionError(f"merge: inf or nan when the lse are near {la.max().item():.0f}: "
                             "exp() of that overflows in float32. Hint: subtract the larger "
                             "of the two lse before exponentiating, and add it back")
    if not (_close(got[0], out, 1e-4) and _close(got[1], lse, 1e-3)):
        raise AssertionError("merge: wrong when the lse are large; subtract the larger lse first")


def _check_kinds(block_kind) -> None:
    for causal in (True, False):
        for qc in range(8):
            for kc in range(8):
                got, want = block_kind(qc, kc, causal), _expected_kind(qc, kc, causal)
                if got == want:
                    continue
                where = f"block_kind({qc}, {kc}, causal={causal}) returned {got!r}, expected one of {KINDS}"
                if got not in KINDS:
                    raise AssertionError(where)
                if not causal:
                    raise AssertionError(f"{where}: without a causal mask every key is visible")
                if kc > qc:
                    raise AssertionError(f"{where}: every key of chunk {kc} comes after every "
                                         f"query of chunk {qc}; under a causal mask none is visible")
                if kc < qc:
                    raise AssertionError(f"{where}: every key of chunk {kc} comes before every "
                                         f"query of chunk {qc}: all of them are visible, no mask")
                raise AssertionError(f"{where}: in the same chunk query i sees keys 0..i only: "
                                     "the lower triangle")


def simulate(merge, block_kind, world: int, causal: bool, seq: int = 16, seed: int = 0):
    """Zigzag ring attention of every simulated rank with the given functions; the full output
    reassembled in sequence order, and full attention for comparison."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 2, seq, 4, generator=g) for _ in range(3))
    size, scale = seq // (2 * world), 1.0 / math.sqrt(q.shape[-1])
    chunk = lambda t, c: t[:, :, c * size:(c + 1) * size]    # noqa: E731
    out = torch.empty_like(q)
    for r in range(world):
        for cq in chunk_ids(r, world, "zigzag"):
            acc = None
            for step in range(world):
                for ck in chunk_ids((r - step) % world, world, "zigzag"):
                    kind = block_kind(cq, ck, causal)
                    if kind == "skip":
                        continue
                    part = attend(chunk(q, cq), chunk(k, ck), chunk(v, ck), scale, kind == "diagonal")
                    acc = part if acc is None else merge(*acc, *part)
            out[:, :, cq * size:(cq + 1) * size] = acc[0]
    return out, F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def check_ring_step(merge, block_kind) -> str:
    """Your merge and block_kind, alone and in a zigzag ring on 2 and 4 simulated ranks."""
    _check_merge(merge)
    _check_kinds(block_kind)
    for world in (2, 4):
        for causal in (True, False):
            got, want = simulate(merge, block_kind, world, causal)
            if not _close(got, want):
                raise AssertionError(f"{world} ranks, causal={causal}: the ring's output differs "
                                     "from full attention")
    msg = "correct: the merge and the causal blocks give full attention on 2 and 4 ranks, causal and not"
    print(msg)
    return msg
