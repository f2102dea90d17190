"""all-to-all as a collective: its bytes, its place in the alpha-beta model, its cost under skew.

Run on every rank (``processes.spawn(bench.collectives, 4, device="cpu")``):

* ``collectives``: all-to-all, all-gather and all-reduce of the SAME buffer size M per rank
  (all-to-all: M in, M out; all-gather: M/n in, M out; all-reduce: M), sizes from a few KiB
  to a few MiB, interleaved (the order rotates every repetition, a barrier before each call),
  each call's time the slowest rank's, the median over repetitions; then one alpha-beta fit
  per collective (``costmodel.fit_alpha_beta``). What each rank sends to other ranks:

      all-to-all   (n-1)/n x M    in ONE step: every pair exchanges directly (n-1 messages)
      all-gather   (n-1)/n x M    ring: n-1 steps
      all-reduce  2(n-1)/n x M    ring: a reduce-scatter then an all-gather, 2(n-1) steps

* ``skew``: the dispatch of expert parallelism for routers of growing skew: the tokens of
  every rank routed by a router whose logit of expert 0 is raised by ``bias``; the send counts
  the layer would use (comm.exchange_counts's input) and the time of the payload all-to-all.
  The most loaded rank receives the most bytes and every other rank waits for it. Bias None:
  exactly even counts, where each rank sends (n-1)/n x k x tokens rows to the others.
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from source_code.costmodel import fit_alpha_beta
from source_code.distributed import context
from source_code.expert_parallel import comm, router

# torch 2.14 renames all_gather_into_tensor (a FutureWarning); 2.6 has only the old name
ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
SIZES = [2**12, 2**14, 2**16, 2**18, 2**20, 2**22, 2**24]   # bytes per rank


def wire_bytes(op: str, n: int, nbytes: float) -> float:
    """What one rank sends to the others in one call of ``op`` on an M-byte buffer (see above)."""
    share = (n - 1) / n * nbytes
    return {"all_to_all": share, "all_gather": share, "all_reduce": 2 * share}[op]


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _slowest(seconds: float) -> float:
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def _timed(fn, device) -> float:
    _sync(device)
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return _slowest(time.perf_counter() - t0)


def collectives(sizes=tuple(SIZES), reps: int = 7) -> dict:
    """Median seconds per collective and size, and the alpha-beta fit of each."""
    n, device = dist.get_world_size(), context().device
    calls = {}
    for size in sizes:
        numel = size // 4
        buf = torch.randn(numel, device=device)
        out = torch.empty_like(buf)
        part = buf[: numel // n].clone()
        calls[size] = {"all_to_all": lambda b=buf, o=out: dist.all_to_all_single(o, b),
                       "all_gather": lambda p=part, o=out: ALL_GATHER(o, p),
                       "all_reduce": lambda b=buf: dist.all_reduce(b)}
    names = ["all_to_all", "all_gather", "all_reduce"]
    times = {op: {s: [] for s in sizes} for op in names}
    for rep in range(reps + 1):                                # rep 0 warms up
        for size in sizes:
            for j in range(len(names)):
                op = names[(rep + j) % len(names)]             # rotate who goes first
                t = _timed(calls[size][op], device)
                if rep:
                    times[op][size].append(t)
    median = {op: {s: statistics.median(v) for s, v in per.items()} for op, per in times.items()}
    fits = {op: fit_alpha_beta(list(m), list(m.values())) for op, m in median.items()}
    return {"world": n, "sizes": list(sizes), "median": median, "fits": fits,
            "wire": {op: {s: wire_bytes(op, n, s) for s in sizes} for op in names}}


def routed_counts(tokens: int, dim: int, n_experts: int, k: int, bias, seed: int) -> torch.Tensor:
    """(E,) assignments per expert of this rank's tokens under a router skewed towards expert 0;
    ``bias`` None: exactly even counts (k * tokens / E each), the case the formula describes."""
    if bias is None:
        return torch.full((n_experts,), k * tokens // n_experts, dtype=torch.int64)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, dim, generator=g)
    w = torch.randn(n_experts, dim, generator=g) / dim ** 0.5
    logits = x @ w.T
    logits[:, 0] += bias
    r = router.route(logits, k)
    return router.tokens_per_expert(r.expert, n_experts, r.keep)


def skew(biases=(None, 0.0, 1.0, 2.0, 4.0), tokens: int = 8192, dim: int = 256, n_experts: int = 8,
         k: int = 2, reps: int = 5) -> list:
    """For each router bias: bytes each rank sends and receives, and the payload all-to-all's time."""
    n, rank, device = dist.get_world_size(), dist.get_rank(), context().device
    rows = {}
    for bias in biases:
        per_expert = routed_counts(tokens, dim, n_experts, k, bias, seed=rank).to(device)
        incoming = comm.exchange_counts(per_expert).view(n, -1)
        send, recv = per_expert.view(n, -1).sum(1).tolist(), incoming.sum(1).tolist()
        payload = torch.randn(sum(send), dim, device=device)
        rows[bias] = (send, recv, payload)
    times = {b: [] for b in biases}
    ledgers = {}
    for rep in range(reps + 1):
        for j in range(len(biases)):
            bias = biases[(rep + j) % len(biases)]
            send, recv, payload = rows[bias]
            with comm.counting() as ledger:
                t = _timed(lambda: comm.all_to_all(payload, send, recv), device)
            ledgers[bias] = ledger.calls[0]
            if rep:
                times[bias].append(t)
    out = []
    for bias in biases:
        got = [None] * n
        dist.all_gather_object(got, {"sent": ledgers[bias]["sent"], "received": ledgers[bias]["received"]})
        out.append({"bias": bias, "seconds": statistics.median(times[bias]),
                    "sent": [g["sent"] for g in got], "received": [g["received"] for g in got],
                    "row_bytes": dim * 4, "assignments": k * tokens})
    return out


def report() -> dict:
    """Both measurements in one run (call on every rank)."""
    return {"collectives": collectives(), "skew": skew()}
