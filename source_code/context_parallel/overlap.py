"""When the ring is free: the tokens per rank above which a hop hides behind the attention.

At each ring step a rank attends its c query tokens to one block of c keys while the next K/V
block travels. The hop is hidden when the compute takes at least as long as the transfer:

    compute = F x c^2 / rate                F: attention FLOPs per (query, key) pair of a block,
                                               b x h x 4d forward (q k^T and p v: 2d each),
                                               b x h x 10d backward (scores again, dV, dP, dQ, dK)
    transfer = alpha + G x c / bandwidth     G: bytes per token of the hop: K and V,
                                               2 x b x h_kv x d x itemsize forward; backward
                                               also dK/dV in fp32: + 2 x b x h_kv x d x 4

    hidden  <=>  F c^2 / rate >= alpha + G c / bandwidth
            <=>  c >= c*, the positive root of  F/rate c^2 - G/bandwidth c - alpha = 0
    (alpha = 0:  c* = (G / F) x (rate / bandwidth): bytes per FLOP x FLOPs per byte of the link)

The compute grows with c^2 and the transfer with c: above c* tokens per rank the ring costs
nothing but the memory of one block in flight. ``flops_per_pair`` and ``hop_bytes_per_token``
are the formulas; notebook 13 counts both from the lesson's kernel (FlopCounterMode) and from
the tensors a hop sends, and asserts they agree.

Rates (one direction of a link, dense bf16 compute), the same datasheet figures that notebook
18's links use (source_code/less_communication/links.py; a lesson does not import a later one):
* H100 SXM: 989 TFLOP/s dense bf16 (NVIDIA H100 Tensor Core GPU datasheet);
* NVLink 4 inside an H100 node: 900 GB/s per GPU both directions together, 450 GB/s each way
  (NVIDIA H100 datasheet), alpha 5 us;
* InfiniBand NDR between nodes: 400 Gb/s per port = 50 GB/s, one port per GPU as in a DGX H100
  (NVIDIA ConnectX-7 datasheet), alpha 5 us.
A real attention kernel reaches a fraction of the peak (``utilisation``): the slower the
compute, the earlier the ring is free, so the peak gives the largest (most careful) c*.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

H100_BF16_FLOPS = 989e12
LINKS = {   # name: (alpha s, bytes/s each way, source)
    "NVLink (H100 node)": (5e-6, 450e9, "NVLink 4, H100 SXM datasheet: 900 GB/s both ways"),
    "InfiniBand NDR": (5e-6, 50e9, "InfiniBand NDR 400 Gb/s per GPU, ConnectX-7 datasheet"),
}


@dataclass(frozen=True)
class Layer:
    """The attention shapes that decide c*: heads, K/V heads (grouped-query), head dim."""
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    batch: int = 1
    itemsize: int = 2        # bf16 K/V


def flops_per_pair(layer: Layer, phase: str = "forward") -> float:
    """Attention FLOPs per (query, key) pair of a block, all heads and samples."""
    per_head = {"forward": 4, "backward": 10}[phase] * layer.head_dim
    return layer.batch * layer.heads * per_head


def hop_bytes_per_token(layer: Layer, phase: str = "forward") -> float:
    """Bytes one hop sends per token of the block: K and V (+ dK and dV in fp32 backward)."""
    kv = 2 * layer.batch * layer.kv_heads * layer.head_dim * layer.itemsize
    return kv + (2 * layer.batch * layer.kv_heads * layer.head_dim * 4 if phase == "backward" else 0)


def query_hop_bytes_per_token(layer: Layer) -> float:
    """Bytes per token of one forward hop if the queries travelled instead of K and V: the block's
    q (all heads, in the activations' dtype) goes on together with its running output and
    log-sum-exp, which must stay fp32 while n partial results are merged into them (as the ring's
    dK/dV sums do), and come home after the last hop."""
    q = layer.batch * layer.heads * layer.head_dim * layer.itemsize
    return q + layer.batch * layer.heads * layer.head_dim * 4 + layer.batch * layer.heads * 4


def threshold(flops_pair: float, bytes_token: float, rate: float, bandwidth: float, alpha: float = 0.0) -> float:
    """Tokens per rank c* from which compute(c) >= transfer(c) (the positive root above)."""
    a, b = flops_pair / rate, bytes_token / bandwidth
    return (b + math.sqrt(b * b + 4 * a * alpha)) / (2 * a)


def compute_s(c: float, flops_pair: float, rate: float) -> float:
    return flops_pair * c * c / rate


def transfer_s(c: float, bytes_token: float, bandwidth: float, alpha: float = 0.0) -> float:
    return alpha + bytes_token * c / bandwidth


def table(layer: Layer = Layer(), rate: float = H100_BF16_FLOPS, utilisation: float = 1.0,
          visible: float = 1.0) -> list[dict]:
    """c* per link and phase for ``layer`` at ``utilisation`` x ``rate``; ``visible``: the share
    of a block's pairs a step scores (1 without a mask; 1/2 for a causal zigzag step after the
    first, which scores 2 of its 4 chunk pairs)."""
    rows = []
    for name, (alpha, bw, source) in LINKS.items():
        for phase in ("forward", "backward"):
            f, g = visible * flops_per_pair(layer, phase), hop_bytes_per_token(layer, phase)
            rows.append({"link": name, "phase": phase, "source": source,
                         "tokens": threshold(f, g, utilisation * rate, bw, alpha),
                         "tokens_no_alpha": threshold(f, g, utilisation * rate, bw)})
    return rows
