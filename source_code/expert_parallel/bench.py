"""all-to-all as a collective: its bytes, its place in the alpha-beta model, its cost under skew.

    python -m source_code.expert_parallel.bench                    # 4 processes, about 10 s
    python -m source_code.expert_parallel.bench --world 8 --tokens 16384 --dim 1024

Run on every rank (``processes.spawn(bench.report, 4, device="cpu")``, or from main):

* ``collectives``: all-to-all, all-gather and all-reduce of the SAME buffer size M per rank
  (all-to-all: M in, M out; all-gather: M/n in, M out; all-reduce: M), sizes from a few KiB
  to a few MiB, interleaved (the order rotates every repetition, a barrier before each call),
  each call's time the slowest rank's, the median over repetitions; then one alpha-beta fit
  per collective (``costmodel.fit_alpha_beta``). What a rank receives from the others is
  counted from the buffers handed to each call (all-to-all: wire.recording; all-gather: the
  output less the rank's own input); the formulas, for comparison:

      all-to-all   (n-1)/n x M    pairwise: n-1 messages of M/n, one to each other rank
      all-gather   (n-1)/n x M    ring: n-1 steps of M/n
      all-reduce  2(n-1)/n x M    ring: a reduce-scatter then an all-gather, 2(n-1) steps

  In the alpha-beta model a rank sends one message at a time, so the pairwise exchange takes
  n-1 steps too: (n-1) alpha + (n-1)/n M / beta, the all-gather's time. Libraries post the
  n-1 messages of an all-to-all at once (they do not depend on each other, unlike a ring's
  steps), which can overlap their latencies but not their bytes on a shared link.

* ``skew``: the dispatch of expert parallelism for routers of growing skew: the tokens of
  every rank routed by a router whose logit of expert 0 is raised by ``bias``; the send counts
  the layer would use (comm.exchange_counts's input), the bytes counted from the payload
  all-to-all's buffers and its time. Bias None: exactly even counts, where each rank sends
  (n-1)/n x k x tokens rows to the others. Over a network the busiest receiver's link would
  set the time; on one machine there are no links (see notebook 14).

Rank 0 prints a line per size and per router as it goes.
"""
from __future__ import annotations

import statistics

import torch
import torch.distributed as dist

from source_code import processes
from source_code.cli import Parser, positive_int
from source_code.costmodel import fit_alpha_beta
from source_code.distributed import context, print0
from source_code.errors import LaunchError, run_main
from source_code.expert_parallel import comm, router, wire
from source_code.measure import clock

# torch 2.14 renames all_gather_into_tensor (a FutureWarning); 2.6 has only the old name
ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
SIZES = [2**12, 2**14, 2**16, 2**18, 2**20, 2**22, 2**24]   # bytes per rank
NAMES = ["all_to_all", "all_gather", "all_reduce"]


def formula_bytes(op: str, n: int, nbytes: float) -> float:
    """What one rank exchanges with the others in one call of ``op`` on an M-byte buffer."""
    share = (n - 1) / n * nbytes
    return {"all_to_all": share, "all_gather": share, "all_reduce": 2 * share}[op]


def slowest(seconds: float) -> float:
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def timed(fn, device) -> float:
    """The slowest rank's seconds for ``fn()``, all ranks starting together."""
    dist.barrier()
    t0 = clock(device)
    fn()
    return slowest(clock(device) - t0)


def collectives(sizes=tuple(SIZES), reps: int = 7) -> dict:
    """Median seconds per collective and size, the alpha-beta fit of each, and the bytes each
    rank received from the others counted from the buffers (all-to-all, all-gather)."""
    n, device = dist.get_world_size(), context().device
    calls, counted = {}, {"all_to_all": {}, "all_gather": {}}
    for size in sizes:
        numel = size // 4
        buf = torch.randn(numel, device=device)
        out = torch.empty_like(buf)
        part = buf[: numel // n].clone()
        calls[size] = {"all_to_all": lambda b=buf, o=out: dist.all_to_all_single(o, b),
                       "all_gather": lambda p=part, o=out: ALL_GATHER(o, p),
                       "all_reduce": lambda b=buf: dist.all_reduce(b)}
        with wire.recording() as seen:
            calls[size]["all_to_all"]()
        counted["all_to_all"][size] = seen[0]["received"]
        counted["all_gather"][size] = (out.numel() - part.numel()) * out.element_size()
    times = {op: {s: [] for s in sizes} for op in NAMES}
    for rep in range(reps + 1):                                # rep 0 warms up
        for size in sizes:
            for j in range(len(NAMES)):
                op = NAMES[(rep + j) % len(NAMES)]             # rotate who goes first
                t = timed(calls[size][op], device)
                if rep:
                    times[op][size].append(t)
        if rep:
            print0(f"  collectives: repetition {rep}/{reps} done")
    median = {op: {s: statistics.median(v) for s, v in per.items()} for op, per in times.items()}
    fits = {op: fit_alpha_beta(list(m), list(m.values())) for op, m in median.items()}
    return {"world": n, "sizes": list(sizes), "median": median, "fits": fits, "counted": counted,
            "formula": {op: {s: formula_bytes(op, n, s) for s in sizes} for op in NAMES}}


def routed_counts(tokens: int, dim: int, n_experts: int, k: int, bias, seed: int) -> torch.Tensor:
    """(E,) assignments per expert of this rank's tokens under a router skewed towards expert 0;
    ``bias`` None: exactly even counts (k * tokens / E each), the case the formula describes."""
    if bias is None:
        if (k * tokens) % n_experts:
            raise ValueError(f"even counts need k x tokens ({k} x {tokens}) divisible by {n_experts} experts")
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
    """For each router bias: bytes each rank sends and receives (counted from the payload
    all-to-all's buffers), and that all-to-all's time."""
    n, rank, device = dist.get_world_size(), dist.get_rank(), context().device
    if n_experts % n or not 1 <= k <= n_experts:
        raise ValueError(f"skew needs experts ({n_experts}) divisible by the ranks ({n}) and 1 <= k <= experts")
    rows = {}
    for bias in biases:
        per_expert = routed_counts(tokens, dim, n_experts, k, bias, seed=rank).to(device)
        incoming = comm.exchange_counts(per_expert).view(n, -1)
        send, recv = per_expert.view(n, -1).sum(1).tolist(), incoming.sum(1).tolist()
        payload = torch.randn(sum(send), dim, device=device)
        rows[bias] = (send, recv, payload)
    times = {b: [] for b in biases}
    moved = {}
    for rep in range(reps + 1):
        for j in range(len(biases)):
            bias = biases[(rep + j) % len(biases)]
            send, recv, payload = rows[bias]
            with wire.recording() as seen:
                t = timed(lambda: comm.all_to_all(payload, send, recv), device)
            moved[bias] = seen[0]
            if rep:
                times[bias].append(t)
        if rep:
            print0(f"  skewed dispatch: repetition {rep}/{reps} done")
    out = []
    for bias in biases:
        got = [None] * n
        dist.all_gather_object(got, {"sent": moved[bias]["sent"], "received": moved[bias]["received"]})
        out.append({"bias": bias, "seconds": statistics.median(times[bias]),
                    "sent": [g["sent"] for g in got], "received": [g["received"] for g in got],
                    "row_bytes": dim * 4, "assignments": k * tokens})
    return out


def report(reps: int = 7, tokens: int = 8192, dim: int = 256, n_experts: int = 8, k: int = 2) -> dict:
    """Both measurements in one run (call on every rank)."""
    return {"collectives": collectives(reps=reps), "device": str(context().device),
            "skew": skew(tokens=tokens, dim=dim, n_experts=n_experts, k=k, reps=max(reps - 2, 1))}


def check(args) -> None:
    """Every flag before any process starts: a LaunchError naming the fix."""
    if args.world < 2:
        raise LaunchError(f"error: --world {args.world}: an all-to-all needs at least 2 processes")
    if args.experts % args.world:
        raise LaunchError(f"error: --experts {args.experts} do not split over --world {args.world} ranks; "
                          f"use a multiple of {args.world}")
    if args.k > args.experts:
        raise LaunchError(f"error: --k {args.k} exceeds --experts {args.experts}")
    if (args.k * args.tokens) % args.experts:
        raise LaunchError(f"error: --k x --tokens ({args.k} x {args.tokens}) must be divisible by --experts "
                          f"{args.experts} for the even router; use a multiple of {args.experts}")


def main(argv=None) -> int:
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=positive_int, default=4, help="processes (>= 2)")
    p.add_argument("--reps", type=positive_int, default=7, help="timed repetitions per size")
    p.add_argument("--tokens", type=positive_int, default=8192, help="tokens per rank (skew)")
    p.add_argument("--dim", type=positive_int, default=256, help="numbers per token row (skew)")
    p.add_argument("--experts", type=positive_int, default=8)
    p.add_argument("--k", type=positive_int, default=2)
    p.add_argument("--device", choices=("cpu", "auto"), default="cpu",
                   help="cpu: gloo on the CPU; auto: the device policy (one GPU per process)")
    args = p.parse_args(argv)
    check(args)
    r = processes.spawn(report, args.world, args.reps, args.tokens, args.dim, args.experts, args.k,
                        device=args.device, stream=False)[0]
    coll, big = r["collectives"], r["collectives"]["sizes"][-1]
    for op in NAMES:
        alpha, beta = coll["fits"][op]
        print(f"{op}: {1e3 * coll['median'][op][big]:.2f} ms at {big / 2**20:.0f} MiB per rank, "
              f"alpha {1e6 * alpha:.0f} us, beta {beta / 1e9:.2f} GB/s")
    even = r["skew"][0]["seconds"]
    for row in r["skew"]:
        name = "even split" if row["bias"] is None else f"bias {row['bias']:g}"
        print(f"dispatch, {name}: most received {max(row['received']) / 2**20:.2f} MiB, "
              f"{1e3 * row['seconds']:.1f} ms ({row['seconds'] / even:.2f}x even)")
    ratio = coll["median"]["all_to_all"][big] / coll["median"]["all_gather"][big]
    print(f"summary: world_size={args.world} device={r['device']} a2a_over_allgather={ratio:.3f} "
          f"skew_time_ratio={r['skew'][-1]['seconds'] / even:.3f}")
    return 0


if __name__ == "__main__":
    run_main(main)
