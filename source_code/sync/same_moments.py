"""Two implementations at two sizes, timed in the same moments: how a ratio changes with size.

Used by ``allreduce_benchmark.measure`` (notebook 03): the parameter server's time over the
ring's at the smallest size and at the largest. Measured size after size, the two ratios would
be taken seconds apart, and a machine that gets busier in between moves one and not the other.
Here each repetition calls both implementations at both sizes, one call after another, and
each ratio is taken from each one's fastest call: all four come from the same window of about
a second.

    from source_code.sync import same_moments
    pairs = same_moments.measure(4 * 2**10, 16 * 2**20, reps=8)   # on every rank of a group
    same_moments.ratios(pairs)   # {size: server's fastest call / ring's fastest call}
    same_moments.growth(pairs)   # how many times that ratio grows from the small size to the large
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from source_code.distributed import context
from source_code.sync.comms import IMPLEMENTATIONS

PAIR = ("parameter_server", "ring")   # the ratio's numerator, its denominator


def timed_call(name: str, buf: torch.Tensor) -> tuple[float, float]:
    """One all-reduce of ``buf`` by implementation ``name`` after a barrier: (seconds on the
    clock, this process's CPU seconds)."""
    buf.fill_(1.0)
    if buf.is_cuda:
        torch.cuda.synchronize(buf.device)
    dist.barrier()
    start, cpu_start = time.perf_counter(), time.process_time()
    IMPLEMENTATIONS[name](buf)
    if buf.is_cuda:
        torch.cuda.synchronize(buf.device)
    return time.perf_counter() - start, time.process_time() - cpu_start


def measure(small: int, large: int, reps: int = 8, pair=PAIR) -> dict:
    """Run on every rank: {name: {size: [seconds per repetition, the slowest rank's]}}; each
    repetition times ``pair`` at ``small`` then at ``large`` (the order of the pair alternates);
    one warm-up repetition first, not recorded."""
    device = context().device
    bufs = {size: torch.empty(size // 4, dtype=torch.float32, device=device) for size in (small, large)}
    times = {name: {size: [] for size in bufs} for name in pair}
    for rep in range(reps + 1):
        for size, buf in bufs.items():
            for name in (pair if rep % 2 else pair[::-1]):
                elapsed, _ = timed_call(name, buf)
                if rep:
                    times[name][size].append(elapsed)
    for name in pair:
        for size in bufs:
            slowest = torch.tensor(times[name][size], dtype=torch.float64, device=device)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            times[name][size] = slowest.tolist()
    return times


def ratios(times: dict, pair=PAIR) -> dict:
    """{size: fastest call of pair[0] / fastest call of pair[1]} (each one's least disturbed call)."""
    top, bottom = (times[name] for name in pair)
    return {size: min(top[size]) / min(bottom[size]) for size in sorted(top, key=int)}


def growth(times: dict, pair=PAIR) -> float:
    """The ratio at the large size over the ratio at the small one."""
    small, large = ratios(times, pair).values()
    return large / small
