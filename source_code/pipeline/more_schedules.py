"""Two schedules that shrink the bubble of 1F1B, as per-rank operation orders for the simulator.

    python -m source_code.pipeline.simulator          # prints their orders and bubbles too

Only simulated here (``simulator.simulate``); the real runs of this package execute naive,
GPipe and 1F1B, and ``torch.distributed.pipelining`` has both kinds (library.py).

**Interleaved 1F1B** (Narayanan et al. 2021, Megatron-LM): each of the p ranks holds v model
chunks, looped: chunk c of rank r is virtual stage c p + r, so a microbatch visits every rank
v times. An operation is ``(kind, microbatch, chunk)``. The order is Megatron's: microbatches
go through the chunks in groups of p; rank r runs (p - r - 1) 2 + (v - 1) p warm-up forwards
(all of them when m = p), then one forward and one backward, then the remaining backwards.
A chunk's operation costs 1/v of the rank's whole stage, so the pipe fills and drains v times
faster: the step is m (F + B) + (p - 1)(F + B) / v, a bubble of (p - 1) / (v m) of the ideal
step m (F + B) (F, B: one microbatch through all of a rank's chunks). Needs m a multiple of p.

**ZB-H1** (Qi et al. 2023, "Zero Bubble Pipeline Parallelism"): the backward is split into
``B``, the gradient of the stage's input (the previous stage waits for it), and ``W``, the
gradient of the weights (nobody waits for it). Rank s runs 1F1B's order with B in place of
the whole backward, and a W right after each B, except that the W's of its first s
microbatches are put off to the end: the later ranks send their input gradients back sooner,
and the W's fill the idle slots at the end. The activations of a microbatch are freed after
its W, so rank s holds at most p microbatches (1F1B's peak on stage 0). The step is
m (F + B + W) + (p - 1)(F + B - W) when W <= F (the paper's case; the simulator gives
(p - 1)(F + B - min(F, W)) in general), against 1F1B's (p - 1)(F + B + W). Needs m >= p.
"""
from __future__ import annotations


def _check(p: int, m: int, s: int) -> None:
    if p < 1 or m < 1 or not 0 <= s < p:
        raise ValueError(f"need p >= 1, m >= 1 and 0 <= s < p, got p={p}, m={m}, s={s}")


def interleaved_order(p: int, m: int, s: int, v: int = 2) -> list[tuple[str, int, int]]:
    """Rank s's interleaved 1F1B order: ("F" | "B", microbatch, chunk) with chunk in 0..v-1."""
    _check(p, m, s)
    if v < 1:
        raise ValueError(f"need v >= 1 chunks per rank, got v={v}")
    if m % p:
        raise ValueError(f"interleaved 1F1B needs m a multiple of p (microbatches go in groups "
                         f"of p), got p={p}, m={m}")
    total = m * v                               # operations of each kind on this rank

    def chunk(k: int, forward: bool) -> int:    # the k-th forward (backward) runs this chunk
        c = (k % (p * v)) // p
        return c if forward else v - 1 - c

    def mb(k: int) -> int:                      # ... on this microbatch
        return (k // (p * v)) * p + k % p

    warmup = total if m == p else min((p - s - 1) * 2 + (v - 1) * p, total)
    order = [("F", mb(k), chunk(k, True)) for k in range(warmup)]
    for k in range(total - warmup):             # steady state: one forward, one backward
        order += [("F", mb(warmup + k), chunk(warmup + k, True)), ("B", mb(k), chunk(k, False))]
    order += [("B", mb(k), chunk(k, False)) for k in range(total - warmup, total)]
    return order


def zb_h1_order(p: int, m: int, s: int) -> list[tuple[str, int]]:
    """Rank s's ZB-H1 order: F, B (input gradient) and W (weight gradient) per microbatch."""
    _check(p, m, s)
    if m < p:
        raise ValueError(f"ZB-H1 needs m >= p microbatches, got p={p}, m={m}")
    warmup = p - s - 1
    order, owed = [("F", i) for i in range(warmup)], []

    def backward(i):
        order.append(("B", i))
        owed.append(i)
        if len(owed) > s:                       # the first s W's wait until the end
            order.append(("W", owed.pop(0)))
    for k in range(m - warmup):                 # steady state: F, B (and a W)
        order.append(("F", warmup + k))
        backward(k)
    for i in range(m - warmup, m):              # cool-down
        backward(i)
    return order + [("W", i) for i in owed]
