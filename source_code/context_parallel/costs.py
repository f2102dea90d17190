"""What context parallelism sends, by formula, and what each dimension of a 4-D mesh sends.

Ring attention over n ranks, one attention layer, M = bytes of one rank's K (= of its V):
b x h_kv x t/n x d x itemsize, and G = the bytes of its dK (= dV) as the ring sends them:
the dK/dV sums travel in the wider of fp32 and the activations' dtype (ring.py), so G = 2M for
bf16 activations and G = M in fp32 (and in fp64).

    forward:   n-1 hops of K and V                   (n-1) x 2M
    backward:  n-1 hops of K and V, n hops of dK/dV  (n-1) x 2M + n x 2G

The other two families (families.py), same M:

    all-gather:  forward all-gather of K and V       (n-1)/n x n x 2M = (n-1) x 2M
                 backward reduce-scatter of dK, dV   (n-1) x 2M (in the gradients' dtype)
    Ulysses:     forward all-to-all of q, k, v and one back of the output: 4 x (n-1)/n x M
                 backward the same four in reverse:                         4 x (n-1)/n x M

(a collective's bytes as a bandwidth-optimal algorithm sends them per rank, measure.CommCounter).

Each hop is one message to the next rank; with the alpha-beta model of notebook 03
(costmodel.model_time) a hop costs alpha + 2M / beta, and it is hidden when the attention of
one block takes longer. ``mesh_traffic`` lists per rank and per layer what each dimension of
a DP x CP x TP mesh sends (TP splits the heads, so CP's K/V shrink by tp; DP and CP ranks
hold the same weights, so the weight gradients are reduced over dp x cp ranks).
"""
from __future__ import annotations

from source_code import costmodel


def ring_bytes(kv_bytes: int, world: int, grad_bytes: int | None = None) -> dict:
    """Bytes one rank sends per attention layer, by phase (kv_bytes: one rank's K; grad_bytes:
    its dK as sent, fp32: kv_bytes x 4 / itemsize; None: the same as kv_bytes, fp32 inputs)."""
    hops = world - 1
    grad = kv_bytes if grad_bytes is None else grad_bytes
    return {"forward": hops * 2 * kv_bytes, "backward": hops * 2 * kv_bytes + (world * 2 * grad if world > 1 else 0)}


def allgather_bytes(kv_bytes: int, world: int) -> dict:
    """Bytes one rank sends per attention layer with all-gather CP (fp32 gradients: kv_bytes)."""
    return {"forward": (world - 1) * 2 * kv_bytes, "backward": (world - 1) * 2 * kv_bytes}


def ulysses_bytes(kv_bytes: int, world: int) -> dict:
    """Bytes one rank sends per attention layer with Ulysses (q, k, v, out are kv_bytes each)."""
    each = 4 * (world - 1) * kv_bytes / world
    return {"forward": each, "backward": each}


def hop_time(kv_bytes: int, alpha: float, beta: float) -> float:
    """alpha-beta time of one hop (K and V in one message)."""
    return float(costmodel.model_time(2 * kv_bytes, alpha, beta))


def mesh_traffic(batch: int, seq: int, dim: int, heads: int, kv_heads: int, params_per_layer: int,
                 dp: int, cp: int, tp: int, itemsize: int = 2, grad_itemsize: int = 4) -> list[dict]:
    """Per rank, per transformer layer, per training step: (dimension, what, bytes sent)."""
    tokens = batch * seq // cp                              # this rank's tokens
    act = tokens * dim * itemsize                          # one (b, t/cp, d) activation
    kv = batch * (seq // cp) * (kv_heads // tp) * (dim // heads) * itemsize
    ring = costmodel.traffic("ring", tp, act)["rank_sent"] if tp > 1 else 0.0
    cp_bytes = ring_bytes(kv, cp, kv // itemsize * 4)       # dK/dV travel in fp32
    grads = params_per_layer // tp * grad_itemsize
    rows = [
        {"dim": "TP", "what": f"4 all-reduces of the (b, t/cp, d) activation over {tp} ranks",
         "bytes": 4 * ring},
        {"dim": "CP", "what": f"K/V ring over {cp} ranks: forward + backward (dK/dV in fp32)",
         "bytes": cp_bytes["forward"] + cp_bytes["backward"]},
        {"dim": "DP x CP", "what": f"all-reduce of the layer's gradients (1/{tp} of them) over {dp * cp} ranks",
         "bytes": costmodel.traffic("ring", dp * cp, grads)["rank_sent"] if dp * cp > 1 else 0.0},
    ]
    return rows
