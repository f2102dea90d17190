"""Notebook 13's exercise: the log-sum-exp merge and the causal choice of one ring step.

You write, in the notebook::

    def merge(out_a, lse_a, out_b, lse_b):     # -> (out, lse) over the keys of both parts
        ...
    def block_kind(q_chunk, k_chunk, causal):  # -> "full", "diagonal" or "skip"
        ...

``check_ring_step(merge, block_kind)`` draws its own configurations at each call (shapes,
how the keys split between the two parts, world sizes, causal or not), so no printed number
can be copied into an answer: ``merge`` on two parts of the keys of a random attention (also
with scores near 1000, where exp() overflows in float32), ``block_kind`` on every pair of
chunks, classified from the causal mask itself, then whole zigzag ring attentions with both
on simulated ranks (one process: rank r's step s uses the K/V chunks of rank (r - s) mod n,
as the ring would deliver them) against full attention.

It never raises: it prints (``show``) and returns ONE line, ``correct: ...``, ``not done
yet: ...`` or what is wrong with a hint; an exception in your code becomes that line. The
reference solution is in source_code/solutions/nb13_context_parallel.py; the tests run the
check with it and with typical wrong answers.
"""
from __future__ import annotations

import math
import os
import random

import torch
import torch.nn.functional as F

from source_code.context_parallel.layout import chunk_ids
from source_code.context_parallel.partial import attend

KINDS = ("full", "diagonal", "skip")


class Wrong(Exception):
    """What is wrong, in one line."""


def _mask_kind(q_chunk: int, k_chunk: int, causal: bool, size: int = 3) -> str:
    """What the causal mask leaves of a (query chunk, key chunk) block: all, none or part."""
    qpos = torch.arange(q_chunk * size, (q_chunk + 1) * size).unsqueeze(1)
    kpos = torch.arange(k_chunk * size, (k_chunk + 1) * size).unsqueeze(0)
    visible = (kpos <= qpos) if causal else torch.ones(size, size, dtype=torch.bool)
    return "full" if visible.all() else ("skip" if not visible.any() else "diagonal")


def _diff(a, b) -> float:
    if not (torch.is_tensor(a) and a.shape == b.shape):
        return math.inf
    d = (a.double() - b.double()).abs().max().item()
    return d if math.isfinite(d) else math.inf


def _parts(rng: random.Random, big: bool = False):
    """Attention of random queries over two parts of random keys: (part a, part b, both)."""
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    b, h, s, d = rng.randint(1, 3), rng.randint(1, 3), rng.randint(1, 6), rng.choice((2, 4, 8))
    na, nb = (1, rng.randint(8, 20)) if rng.random() < 0.5 else (rng.randint(2, 9), rng.randint(1, 9))
    q, k, v = (torch.randn(b, h, x, d, generator=g) for x in (s, na + nb, na + nb))
    if big:
        q = q * (1000.0 / q.abs().max())                     # scores, and lse, in the hundreds
        k = k / k.abs().max()
    sm = 1.0 / math.sqrt(d)
    qd, kd, vd = q.double(), k.double(), v.double()
    both = (F.scaled_dot_product_attention(qd, kd, vd).float(),
            torch.logsumexp((qd @ kd.transpose(-2, -1)) * sm, -1).float())
    a = attend(q, k[:, :, :na], v[:, :, :na], sm, False)
    bb = attend(q, k[:, :, na:], v[:, :, na:], sm, False)
    keys = lambda x: f"{x} key" + ("s" if x > 1 else "")    # noqa: E731
    return a, bb, both, f"{keys(na)} | {keys(nb)}"


def _check_merge(merge, rng: random.Random) -> None:
    for trial in range(4):
        (oa, la), (ob, lb), (out, lse), split = _parts(rng)
        got = merge(oa, la, ob, lb)
        if not (isinstance(got, tuple) and len(got) == 2):
            raise Wrong("merge must return a pair (out, lse)")
        if _diff(got[0], out) > 1e-5:
            if _diff(got[0], (oa + ob) / 2) < 1e-6:
                raise Wrong(f"merge: a plain average of the two outputs (parts of {split}). Hint: a part "
                            "that holds more of the softmax mass must count more; how much mass does "
                            "a part hold, given its lse?")
            raise Wrong(f"merge: the output differs from attention over both parts' keys by "
                        f"{_diff(got[0], out):.2g} (parts of {split}). Hint: do your two weights add "
                        "up to 1 for every query, each part counted by its share of the mass?")
        if _diff(got[1], lse) > 1e-5:
            raise Wrong("merge: the output is right but the returned lse is not the log-sum-exp of "
                        "all the scores of both parts (the ring's next merge starts from it)")
    (oa, la), (ob, lb), (out, lse), _ = _parts(rng, big=True)
    got = merge(oa, la, ob, lb)
    if not all(torch.is_tensor(t) and bool(torch.isfinite(t).all()) for t in got):
        raise Wrong(f"merge: inf or nan when the lse are near {la.max().item():.0f} (exp of that "
                    "overflows float32). Hint: can you write the weights so that no exp() "
                    "sees a large number?")
    if _diff(got[0], out) > 1e-4 or _diff(got[1], lse) > 1e-3:
        raise Wrong(f"merge: wrong when the lse are near {la.max().item():.0f} (max |diff| "
                    f"{max(_diff(got[0], out), _diff(got[1], lse)):.2g}), right when they are small")


def _check_kinds(block_kind, rng: random.Random) -> None:
    pairs = [(qc, kc, causal) for causal in (True, False) for qc in range(10) for kc in range(10)]
    rng.shuffle(pairs)
    for qc, kc, causal in pairs:
        got, want = block_kind(qc, kc, causal), _mask_kind(qc, kc, causal)
        if got == want:
            continue
        where = f"block_kind(q_chunk={qc}, k_chunk={kc}, causal={causal}) returned {got!r}"
        if got not in KINDS:
            raise Wrong(f"{where}: return one of {', '.join(map(repr, KINDS))}")
        if not causal:
            raise Wrong(f"{where}. Hint: without a causal mask, which keys may a query see?")
        if kc == qc:
            raise Wrong(f"{where}. Hint: within one chunk, does every query come after every key?")
        rel = "a later" if kc > qc else "an earlier"
        raise Wrong(f"{where}. Hint: where do the keys of {rel} chunk sit relative to every query "
                    "of this chunk, and what does the causal mask keep of them?")


def simulate(merge, block_kind, world: int, causal: bool, size: int = 2, seed: int = 0,
             shape=(1, 2, 4), dtype=torch.float64):
    """Zigzag ring attention of every simulated rank with the given functions; the full output
    reassembled in sequence order, and full attention for comparison. ``shape``: (b, h, d)."""
    g = torch.Generator().manual_seed(seed)
    b, h, d = shape
    q, k, v = (torch.randn(b, h, 2 * world * size, d, generator=g, dtype=dtype) for _ in range(3))
    scale = 1.0 / math.sqrt(d)
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


def _check_rings(merge, block_kind, rng: random.Random) -> str:
    worlds = rng.sample((2, 3, 4, 5, 6), 3)
    for world in worlds:
        for causal in rng.sample((True, False), 2):
            shape = (rng.randint(1, 2), rng.randint(1, 3), rng.choice((2, 4, 8)))
            got, want = simulate(merge, block_kind, world, causal, rng.randint(1, 4),
                                 rng.randrange(2**31), shape)
            if _diff(got, want) > 1e-8:
                raise Wrong(f"a zigzag ring of {world} ranks (causal={causal}) differs from full "
                            f"attention by {_diff(got, want):.2g}, though each piece passed alone")
    return f"{len(worlds)} sizes between 2 and 6 ranks"


def check_ring_step(merge, block_kind, show: bool = True, seed: int | None = None) -> str:
    """Your merge and block_kind, alone and in zigzag rings of simulated ranks; one line back."""
    rng = random.Random(int.from_bytes(os.urandom(8), "little") if seed is None else seed)
    try:
        _check_merge(merge, rng)
        _check_kinds(block_kind, rng)
        rings = _check_rings(merge, block_kind, rng)
        line = (f"correct: merge and block_kind give full attention, alone and in zigzag rings of "
                f"{rings}, causal and not, on shapes drawn at random")
    except NotImplementedError:
        line = "not done yet: fill in the TODOs, then run this cell again"
    except Wrong as exc:
        line = f"not yet: {exc}"
    except Exception as exc:  # noqa: BLE001 - an error in the learner's code, said in one line
        first = str(exc).splitlines()[0] if str(exc) else ""
        line = f"not yet: your code raised {type(exc).__name__}: {first}"
    if show:
        print(line)
    return line
