"""The latency-bandwidth (alpha-beta) model of communication, and the bytes each all-reduce moves.

One model for the whole workshop (notebooks 00, 02, 03):

    time(n bytes) = alpha + n / beta        alpha: latency in seconds, beta: bandwidth in bytes/s

``fit_alpha_beta`` fits it to measurements (the ping-pong of notebook 00, the all-reduce
benchmark of notebook 03). ``traffic`` counts what an all-reduce of an M-byte buffer over N
processes moves, for the three algorithms of notebook 02:

    algorithm         messages in a row   busiest link, each direction   a non-root rank sends
    ring              2 (N-1)             2 (N-1)/N x M                  2 (N-1)/N x M
    naive_ring        N-1                 (N-1) x M                      (N-1) x M
    parameter_server  2                   (N-1) x M  (the server's)      M

``predicted_time`` puts the two together: messages in a row x alpha + bytes through the
busiest link / beta (the parameter server receives, then sends: both directions count). The
server's N-1 receives (and then its N-1 sends) are posted at once: their latencies overlap, one
alpha for each direction, while their bytes share the server's one link, one after the other.
That is the model's choice for a link-bound server; a server that also paid a latency per
worker would pay N-1 alphas a direction, N-2 more than this model counts.
"""
from __future__ import annotations

import numpy as np

ALGORITHMS = ("ring", "naive_ring", "parameter_server")


def fit_alpha_beta(nbytes, seconds) -> tuple[float, float]:
    """Least squares of seconds = alpha + nbytes / beta; returns (alpha in s, beta in bytes/s).

    The fit minimises the *relative* error (each row divided by its time), so the microsecond
    points of small messages count as much as the millisecond points of large ones. beta is
    inf when the times do not grow with the size."""
    n = np.asarray(nbytes, dtype=float)
    t = np.asarray(seconds, dtype=float)
    rows = np.stack([np.ones_like(n), n], axis=1) / t[:, None]  # [points, 2]: relative error
    (alpha, inv_beta), *_ = np.linalg.lstsq(rows, np.ones_like(t), rcond=None)
    return float(alpha), (float(1.0 / inv_beta) if inv_beta > 0 else float("inf"))


def model_time(nbytes, alpha: float, beta: float):
    """alpha + nbytes / beta (seconds), for a number or an array of sizes."""
    return alpha + np.asarray(nbytes, dtype=float) / beta


def crossover_bytes(alpha: float, beta: float) -> float:
    """The message size where latency and transfer cost the same: n = alpha * beta."""
    return alpha * beta


def equal_time_bytes(fit_a: tuple[float, float], fit_b: tuple[float, float]) -> float | None:
    """The size where two fitted models (alpha, beta) predict the same time, or None if their
    lines do not cross at a positive size. Below it the model with the smaller alpha wins."""
    (alpha_a, beta_a), (alpha_b, beta_b) = fit_a, fit_b
    per_byte_gap = 1 / beta_b - 1 / beta_a   # extra seconds per byte of b over a
    if per_byte_gap == 0 or (alpha_a - alpha_b) / per_byte_gap <= 0:
        return None
    return (alpha_a - alpha_b) / per_byte_gap


def traffic(algorithm: str, n: int, nbytes: float) -> dict:
    """What one all-reduce of ``nbytes`` over ``n`` processes moves (see the module's table).

    Returns ``messages`` (sequential message latencies), ``rank_sent`` / ``rank_received``
    (a non-root rank), ``link_in`` / ``link_out`` (the busiest link, each direction)."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    if algorithm == "ring":
        per_rank = 2 * (n - 1) / n * nbytes          # 2 (N-1) steps of one chunk, M / N bytes
        return {"messages": 2 * (n - 1), "rank_sent": per_rank, "rank_received": per_rank,
                "link_in": per_rank, "link_out": per_rank}
    if algorithm == "naive_ring":
        per_rank = (n - 1) * nbytes                  # the whole buffer, N-1 times
        return {"messages": n - 1, "rank_sent": per_rank, "rank_received": per_rank,
                "link_in": per_rank, "link_out": per_rank}
    if algorithm == "parameter_server":
        server = (n - 1) * nbytes                    # one buffer from, and one to, every other rank
        return {"messages": 2 if n > 1 else 0, "rank_sent": nbytes if n > 1 else 0,
                "rank_received": nbytes if n > 1 else 0, "link_in": server, "link_out": server}
    raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")


def predicted_time(algorithm: str, n: int, nbytes: float, alpha: float, beta: float) -> float:
    """messages x alpha + bytes / beta, with the bytes the busiest link carries: a ring's
    steps send and receive at once (one direction counts), the server receives everything
    and then sends everything (both directions count)."""
    t = traffic(algorithm, n, nbytes)
    on_the_wire = t["link_in"] + t["link_out"] if algorithm == "parameter_server" else t["link_out"]
    return t["messages"] * alpha + on_the_wire / beta


def busbw_factor(n: int) -> float:
    """nccl-tests' bus bandwidth for all-reduce: busbw = algbw x 2 (N-1)/N, the ring's bytes per
    link per byte of buffer (comparable across N and with the hardware's bandwidth)."""
    return traffic("ring", n, 1.0)["link_out"]
