"""All-reduce benchmark in the style of nccl-tests: ring, naive ring, parameter server, library.

    python -m source_code.sync.allreduce_benchmark --world-size 4            # starts its own processes
    torchrun --standalone --nproc-per-node=4 -m source_code.sync.allreduce_benchmark
    python -m source_code.sync.allreduce_benchmark --world-size 4 --max-size 256MiB --plot bench.png

For each message size the four implementations run *interleaved* (a different order every
repetition, a barrier before each call), so a machine that gets busier or quieter affects all
of them alike. Each call's time is the slowest rank's; the table shows the median over
repetitions, with

    algbw = size / time        busbw = algbw * 2 (n-1) / n

(busbw is what each rank's link actually carries in a ring, nccl-tests' convention for
all-reduce: comparable across world sizes and with the hardware's bandwidth). The last line,
``ring_vs_library_busbw_ratio=R``, is the median over repetitions of time(library) / time(ring)
at --ratio-size (64 MiB): paired ratios cancel the drift of a shared machine. The alpha-beta
model time = alpha + size / beta (beta: bandwidth in bytes/s, ``source_code.costmodel``) is
fitted per implementation (--plot draws measured vs model). Every implementation is first
checked against dist.all_reduce.
gloo + CPU here, NCCL + GPU on a GPU node: the same code.
"""
from __future__ import annotations

import argparse
import json

import numpy as np
import torch
import torch.distributed as dist

from source_code.cli import Parser, positive_int
from source_code.costmodel import busbw_factor, equal_time_bytes, fit_alpha_beta
from source_code.distributed import context, ranks_from_env, run_main, session
from source_code.errors import LaunchError
from source_code.sync import same_moments
from source_code.sync.comms import IMPLEMENTATIONS, library_all_reduce

UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


def parse_size(text: str) -> int:
    """'64MiB' -> 67108864; plain numbers are bytes."""
    for unit in ("GiB", "MiB", "KiB", "B"):
        if text.endswith(unit) and text[: -len(unit)].replace(".", "").isdigit():
            return int(float(text[: -len(unit)]) * UNITS[unit])
    if text.isdigit():
        return int(text)
    raise argparse.ArgumentTypeError(f"size {text!r} not understood; write e.g. 4096, 64KiB or 64MiB")


def human(n: int) -> str:
    for unit in ("GiB", "MiB", "KiB"):
        if n >= UNITS[unit] and n % UNITS[unit] == 0:
            return f"{n // UNITS[unit]}{unit}"
    return f"{n}B"


def measure(sizes, ratio_size: int, budget_bytes: int = 256 * 2**20, ratio_reps: int = 12,
            max_reps: int = 20, min_reps: int = 3, names=tuple(IMPLEMENTATIONS),
            same_moment_reps: int = 8) -> dict:
    """Run on every rank of a group: per implementation and size, the list of call times (s),
    each the slowest rank's. Float32 buffers; reps per size ~ budget_bytes / size, and at least
    ``ratio_reps`` alternating ring / library pairs at ``ratio_size``. Then
    ``same_moment_reps`` repetitions of the parameter server and the ring at the smallest and
    the largest size in the same moments (``same_moments``)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    device = context().device
    # correctness first: an implementation that is fast but wrong must not make it into the table
    probe = torch.randn(1000 + world + 1, generator=torch.Generator().manual_seed(rank)).to(device)
    reference = library_all_reduce(probe.clone())
    for name in names:
        err = float((IMPLEMENTATIONS[name](probe.clone()) - reference).abs().max())
        if err > 1e-4:
            raise RuntimeError(f"{name} all-reduce differs from dist.all_reduce by {err}")
    names = list(names)
    times = {name: {} for name in names}
    cpu_times = {name: {} for name in names}
    for size in sorted(set(sizes) | {ratio_size}):
        buf = torch.empty(size // 4, dtype=torch.float32, device=device)
        reps = max(min_reps, min(max_reps, budget_bytes // size))
        samples = {name: [] for name in names}
        cpu_samples = {name: [] for name in names}  # this process's CPU seconds (all its threads)
        # at the ratio size, extra repetitions of the two compared implementations only
        extra = max(0, ratio_reps - reps) if size == ratio_size else 0
        for rep in range(reps + 1 + extra):  # rep 0 is a warm-up, not recorded
            pool = names if rep <= reps else [n for n in names if n in ("ring", "library")]
            order = pool[rep % len(pool):] + pool[: rep % len(pool)]
            for name in order:
                elapsed, cpu = same_moments.timed_call(name, buf)
                if rep:
                    samples[name].append(elapsed)
                    cpu_samples[name].append(cpu)
        for name in names:
            slowest = torch.tensor([samples[name], cpu_samples[name]], dtype=torch.float64, device=device)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            times[name][size], cpu_times[name][size] = slowest.tolist()
        del buf
    pairs = None
    if same_moment_reps and set(same_moments.PAIR) <= set(names) and len(set(sizes)) > 1:
        pairs = same_moments.measure(min(sizes), max(sizes), same_moment_reps)
    return {"world_size": world, "backend": dist.get_backend(), "device": device.type,
            "sizes": sorted(set(sizes)), "ratio_size": ratio_size, "times": times, "cpu_times": cpu_times,
            "same_moments": pairs}


def summarize(res: dict) -> dict:
    """Medians, algbw, busbw per (implementation, size); alpha-beta fits; the ring/library ratio."""
    n = res["world_size"]
    factor = busbw_factor(n)  # 2 (N-1)/N
    rows, fits = {}, {}
    for name, per_size in res["times"].items():
        sizes = res["sizes"]
        med = [float(np.median(per_size[s])) for s in sizes]
        rows[name] = [{"size": s, "time_us": m * 1e6, "algbw": s / m / 1e9, "busbw": s / m / 1e9 * factor}
                      for s, m in zip(sizes, med)]
        alpha, beta = fit_alpha_beta(sizes, med)  # seconds, bytes/s
        fits[name] = {"alpha_s": alpha, "beta_Bps": beta}
    r = res["ratio_size"]
    paired = np.asarray(res["times"]["library"][r]) / np.asarray(res["times"]["ring"][r])
    return {"rows": rows, "fits": fits, "ratio": float(np.median(paired)), "ratio_size": r,
            "ratio_pairs": len(paired), "times": res["times"], "same_moments": res.get("same_moments"),
            "world_size": n, "backend": res["backend"], "device": res["device"]}


def table(summary: dict) -> str:
    names = list(summary["rows"])
    head1 = f"# {'':>10}" + "".join(f" | {name:^30}" for name in names)
    head2 = f"# {'size':>10}" + "".join(f" | {'time(us)':>10} {'algbw':>9} {'busbw':>9}" for _ in names)
    lines = [f"# all-reduce, float32, {summary['world_size']} ranks, {summary['backend']} on "
             f"{summary['device']}; bandwidths in GB/s, times = median of the slowest rank",
             head1, head2]
    for i, row in enumerate(summary["rows"][names[0]]):
        line = f"  {human(row['size']):>10}"
        for name in names:
            r = summary["rows"][name][i]
            line += f" | {r['time_us']:>10.1f} {r['algbw']:>9.3f} {r['busbw']:>9.3f}"
        lines.append(line)
    lines.append("# alpha-beta fit, time = alpha + size / beta (beta = bandwidth):")
    for name, f in summary["fits"].items():
        lines.append(f"#   {name:<16} alpha = {f['alpha_s'] * 1e6:9.1f} us   beta = {f['beta_Bps'] / 1e9:.3f} GB/s")
    if {"ring", "parameter_server"} <= set(summary["rows"]):
        lines.append(f"# ring faster than parameter_server from: {_mib(measured_crossover(summary))} measured, "
                     f"{_mib(predicted_crossover(summary))} where the fitted models cross")
    lines.append(f"# ratio = median over {summary['ratio_pairs']} interleaved repetitions of "
                 f"time(library)/time(ring) at {human(summary['ratio_size'])}")
    lines.append(f"ring_vs_library_busbw_ratio={summary['ratio']:.3f}")
    return "\n".join(lines)


def _mib(nbytes) -> str:
    return "none" if nbytes is None else f"{nbytes / 2**20:.2f} MiB"


def plot(summary: dict, path=None):
    """Measured time vs size (markers) and the fitted alpha-beta model (lines), log-log."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for (name, rows), color in zip(summary["rows"].items(), plt.rcParams["axes.prop_cycle"].by_key()["color"]):
        s = np.array([r["size"] for r in rows], dtype=float)
        f = summary["fits"][name]
        axes[0].loglog(s, [r["time_us"] for r in rows], "o", color=color, label=f"{name} measured")
        axes[0].loglog(s, (f["alpha_s"] + s / f["beta_Bps"]) * 1e6, "-", color=color, alpha=0.7)
        axes[1].semilogx(s, [r["busbw"] for r in rows], "o-", color=color, label=name)
    axes[0].set(xlabel="message size (bytes)", ylabel="time (us)",
                title="measured (dots) vs alpha-beta model (lines)")
    axes[1].set(xlabel="message size (bytes)", ylabel="busbw (GB/s)",
                title=f"busbw, {summary['world_size']} ranks, {summary['backend']}")
    for ax in axes:
        ax.grid(alpha=0.3, which="both")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    if path:  # --plot PATH asks for the file
        fig.savefig(path, dpi=110)
    return fig


def run(world_size: int = 4, sizes=None, ratio_size: int = 64 * 2**20, budget_bytes: int = 256 * 2**20,
        ratio_reps: int = 12) -> dict:
    """Start ``world_size`` processes, measure, and return the summary (for notebooks and tests)."""
    from source_code.processes import spawn
    sizes = sizes or default_sizes(4 * 2**10, ratio_size)
    return summarize(spawn(measure, world_size, sizes, ratio_size, budget_bytes, ratio_reps)[0])


def default_sizes(min_size: int, max_size: int) -> list[int]:
    sizes, s = [], min_size
    while s <= max_size:
        sizes.append(s)
        s *= 4
    return sizes


def measured_crossover(summary: dict, slow_small: str = "parameter_server", fast_large: str = "ring"):
    """The measured size from which ``fast_large`` beats ``slow_small`` at every larger size: the
    geometric mean of the last size it loses and the first size it wins (the first size if it
    wins everywhere, None if it loses at the largest)."""
    a, b = summary["rows"][slow_small], summary["rows"][fast_large]
    wins = [rb["time_us"] < ra["time_us"] for ra, rb in zip(a, b)]
    if not wins[-1]:
        return None
    first = len(wins) - 1
    while first > 0 and wins[first - 1]:
        first -= 1
    if first == 0:
        return float(a[0]["size"])
    return float(np.sqrt(a[first - 1]["size"] * a[first]["size"]))


def paired_ratios(summary: dict, slow_small: str = "parameter_server", fast_large: str = "ring") -> dict:
    """{size: median over the repetitions of time(slow_small) / time(fast_large)}: the two calls
    of one repetition ran in one round of the implementations (for the ring and the server, one
    call of another implementation between them), so a busy moment of the machine slows both alike."""
    t, out = summary["times"], {}
    for size in (row["size"] for row in summary["rows"][slow_small]):
        a, b = t[slow_small][size], t[fast_large][size]
        n = min(len(a), len(b))  # the ratio size has extra repetitions of two implementations
        out[size] = float(np.median(np.asarray(a[:n]) / np.asarray(b[:n])))
    return out


def crossovers_agree(predicted, measured, largest: float, factor: float = 6) -> bool:
    """The fitted lines and the measurements tell the same story: both cross within ``factor``
    of each other, or both put the crossover at the edge of the measured sizes or past it (no
    crossover, or one above ``largest / factor``). At the edge a busy moment of the machine decides
    whether the last sizes cross or not, in the measurements and in the fit alike."""
    edge = largest / factor
    if (measured is None or measured > edge) and (predicted is None or predicted > edge):
        return True
    return None not in (predicted, measured) and 1 / factor <= predicted / measured <= factor


def predicted_crossover(summary: dict, slow_small: str = "parameter_server", fast_large: str = "ring"):
    """The size where the two fitted alpha-beta models predict the same time (None: they do not cross)."""
    f = summary["fits"]
    return equal_time_bytes((f[fast_large]["alpha_s"], f[fast_large]["beta_Bps"]),
                            (f[slow_small]["alpha_s"], f[slow_small]["beta_Bps"]))


def busbw_by_world_size(world_sizes=(2, 3, 4), size: int = 16 * 2**20, reps: int = 6,
                        names=("ring", "library"), rounds: int = 2) -> dict:
    """busbw (GB/s, median) of ``names`` at one size for each world size, two ways:
    {"wall": {name: {N: busbw}}, "cpu": {name: {N: busbw}}}. "wall" divides by the call's time
    on the clock; "cpu" by the CPU seconds of its busiest rank (its process time during the
    call, every thread counted): the time the rank really worked, which neither waiting for a
    core shared with other processes nor a busy machine adds to. The world sizes take turns,
    ``rounds`` times, ``reps`` / ``rounds`` calls each."""
    from source_code.processes import spawn
    per_round = max(1, reps // rounds)
    samples = {clock: {name: {n: [] for n in world_sizes} for name in names} for clock in ("wall", "cpu")}
    for _ in range(rounds):
        for n in world_sizes:
            res = spawn(measure, n, [size], size, per_round * size, per_round, per_round, per_round, names)[0]
            for name in names:
                samples["wall"][name][n] += res["times"][name][size]
                samples["cpu"][name][n] += res["cpu_times"][name][size]
    return {clock: {name: {n: size / float(np.median(ts)) / 1e9 * busbw_factor(n) for n, ts in per_n.items()}
                    for name, per_n in per_name.items()} for clock, per_name in samples.items()}


def main(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--world-size", type=positive_int, default=4, help="processes to start (ignored under torchrun/srun)")
    p.add_argument("--min-size", type=parse_size, default=parse_size("4KiB"))
    p.add_argument("--max-size", type=parse_size, default=parse_size("64MiB"), help="sizes go x4 up to this")
    p.add_argument("--ratio-size", type=parse_size, default=parse_size("64MiB"),
                   help="size of the ring_vs_library_busbw_ratio line (always measured)")
    p.add_argument("--budget", type=parse_size, default=parse_size("256MiB"),
                   help="bytes per size and implementation: sets the repetitions (3 to 20)")
    p.add_argument("--ratio-reps", type=positive_int, default=12,
                   help="alternating ring/library pairs at --ratio-size for the ratio line")
    p.add_argument("--plot", default="", help="save measured vs model to this PNG")
    p.add_argument("--json", default="", help="write the summary to this file")
    args = p.parse_args(argv)
    if args.min_size < 4 or args.min_size > args.max_size:
        raise LaunchError(f"error: --min-size {args.min_size} must be >= 4 bytes and <= --max-size")
    sizes = default_sizes(args.min_size, args.max_size)
    if ranks_from_env() is None:  # plain python: start our own processes
        if args.world_size < 2:
            raise LaunchError("error: --world-size must be at least 2")
        summary = run(args.world_size, sizes, args.ratio_size, args.budget, args.ratio_reps)
    else:                          # under torchrun / srun: we are one of the ranks
        torch.set_num_threads(1)
        with session(launch_hint="torchrun --standalone --nproc-per-node=4 -m "
                                 "source_code.sync.allreduce_benchmark") as ctx:
            res = measure(sizes, args.ratio_size, args.budget, args.ratio_reps)
        if not ctx.is_main:
            return 0
        summary = summarize(res)
    print(table(summary), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    if args.plot:
        plot(summary, args.plot)
    return 0


if __name__ == "__main__":
    run_main(main)
