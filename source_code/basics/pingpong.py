"""Latency vs bandwidth: a ping-pong between two processes, fitted by time = alpha + bytes / beta.

    python -m source_code.basics.pingpong --world-size 2        # starts its own 2 processes
    torchrun --standalone --nproc-per-node=2 -m source_code.basics.pingpong

Rank 0 sends a message of n bytes to rank 1, which sends it straight back; half the fastest
round trip is the one-way time t(n). Why the fastest and not the median: on a busy machine the
OS scheduler sometimes lets the receiver wait a whole time slice (~2 ms seen here on 2 shared
cores), which is not a cost of the transfer; the median is kept too (``one_way_median_s``). Small messages cost the fixed latency alpha (software
stack, synchronisation); large ones the transfer time n / beta (beta = bandwidth). The fit
(``source_code.costmodel.fit_alpha_beta``, the same fit as the all-reduce benchmark of notebook
03) weights every point by 1 / t (relative error), so the microsecond points count as much as
the millisecond ones. On GPUs the same code sends CUDA tensors over NCCL (device from the Context)
and synchronises before reading the clock.
"""
from __future__ import annotations

import os
import statistics
import time

import numpy as np
import torch
import torch.distributed as dist

from source_code.cli import Parser, positive_int
from source_code.costmodel import crossover_bytes, fit_alpha_beta, model_time  # the one alpha-beta model
from source_code.distributed import context, print0, run_main, session
from source_code.errors import LaunchError

MiB = 2**20
DEFAULT_SIZES = [8 * 4**k for k in range(11)] + [16 * MiB]  # 8 B ... 8 MiB, 16 MiB


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def pingpong(sizes=DEFAULT_SIZES, iters: int = 20, warmup: int = 3, device=None) -> list[dict]:
    """Run inside a process group of >= 2 ranks; ranks 0 and 1 play, others only wait.

    Returns on every rank a list of {"bytes", "one_way_s", "one_way_median_s", "rtt_s": [...]}
    (seconds; one_way_s = fastest round trip / 2; measured on rank 0,
    broadcast to the others so every rank returns the same numbers).
    """
    if device is None:
        device = context().device
    rank = dist.get_rank()
    if dist.get_world_size() < 2:
        raise ValueError("the ping-pong needs 2 processes: use --world-size 2 or --nproc-per-node=2")
    results = []
    for n in sizes:
        buf = torch.zeros(max(1, int(n)), dtype=torch.uint8, device=device)
        rtts = []
        dist.barrier()
        for i in range(warmup + iters):
            _sync(device)
            t0 = time.perf_counter()
            if rank == 0:
                dist.send(buf, dst=1)
                dist.recv(buf, src=1)
            elif rank == 1:
                dist.recv(buf, src=0)
                dist.send(buf, dst=0)
            _sync(device)
            if i >= warmup:
                rtts.append(time.perf_counter() - t0)
        results.append({"bytes": int(buf.numel()), "rtt_s": rtts, "one_way_s": min(rtts) / 2,
                        "one_way_median_s": statistics.median(rtts) / 2})
    box = [results]
    dist.broadcast_object_list(box, src=0)  # rank 0's clock is the measurement
    return box[0]


def run_spawned(world_size: int = 2, sizes=DEFAULT_SIZES, iters: int = 20) -> list[dict]:
    """Start ``world_size`` processes (processes.spawn), run the ping-pong, return rank 0's table.

    OMP_NUM_THREADS=1 as torchrun sets it: measured here, without it the idle OpenMP threads of
    each process compete for the cores and a 8-byte one-way time jumps from ~0.1 ms to ~2-5 ms
    on a 2-core machine (the receiver is not scheduled in time).
    """
    from source_code.processes import spawn
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # inherited by the spawned processes
    return spawn(pingpong, world_size, list(sizes), iters)[0]


def sanity(results: list[dict], alpha: float, beta: float) -> list[str]:
    """Reasons the fit is not believable (empty list when it is)."""
    problems = []
    if not alpha > 0:
        problems.append(f"alpha = {alpha:.3g} s is not positive")
    if not beta > 0 or not np.isfinite(beta):
        problems.append(f"beta = {beta:.3g} B/s is not a positive finite bandwidth")
    small, large = results[0]["bytes"], results[-1]["bytes"]
    if beta > 0 and not alpha > small / beta:
        problems.append(f"{small} B is not latency-dominated (alpha <= n/beta)")
    if beta > 0 and not large / beta > alpha:
        problems.append(f"{large} B is not bandwidth-dominated (n/beta <= alpha)")
    return problems


def format_table(results: list[dict], alpha: float, beta: float) -> str:
    lines = [f"{'bytes':>10} {'one-way us':>11} {'model us':>9} {'GB/s':>7}"]
    for r in results:
        t = r["one_way_s"]
        lines.append(f"{r['bytes']:>10} {t * 1e6:>11.1f} {model_time(r['bytes'], alpha, beta) * 1e6:>9.1f} "
                     f"{r['bytes'] / t / 1e9:>7.3f}")
    lines.append(f"fit: alpha = {alpha * 1e6:.1f} us, beta = {beta / 1e9:.3f} GB/s, "
                 f"crossover n = alpha*beta = {crossover_bytes(alpha, beta) / 1024:.1f} KiB")
    return "\n".join(lines)


def parse_sizes(text: str) -> list[int]:
    try:
        sizes = [int(s) for s in text.split(",") if s]
    except ValueError:
        raise LaunchError(f"error: --sizes wants bytes separated by commas, e.g. 8,1024,1048576; got {text!r}")
    if len(sizes) < 2 or min(sizes) < 1:
        raise LaunchError("error: --sizes needs at least two positive sizes to fit alpha and beta")
    return sizes


def main(argv=None):
    p = Parser(description="Ping-pong between two processes; fit alpha and beta.")
    p.add_argument("--world-size", type=positive_int, default=2,
                   help="processes to start when not launched by torchrun/srun (default 2)")
    p.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)),
                   help="message sizes in bytes, comma-separated (default 8 B ... 16 MiB)")
    p.add_argument("--iters", type=positive_int, default=20, help="timed round trips per size")
    args = p.parse_args(argv)
    sizes = parse_sizes(args.sizes)
    if args.world_size < 2:
        raise LaunchError("error: --world-size must be at least 2 (rank 0 and rank 1 play ping-pong)")
    from source_code.distributed import ranks_from_env
    if ranks_from_env() is None:
        report(run_spawned(args.world_size, sizes, args.iters))
    else:
        with session(launch_hint="torchrun --standalone --nproc-per-node=2 -m "
                                 "source_code.basics.pingpong") as ctx:
            report(pingpong(sizes, args.iters, device=ctx.device))  # print0 inside the group
    return 0


def report(results: list[dict]) -> None:
    alpha, beta = fit_alpha_beta([r["bytes"] for r in results], [r["one_way_s"] for r in results])
    print0(format_table(results, alpha, beta))
    for problem in sanity(results, alpha, beta):
        print0("warning:", problem)


if __name__ == "__main__":
    run_main(main)
