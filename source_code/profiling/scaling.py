"""Strong and weak scaling: samples/s for 1, 2, ... processes and the efficiency against ideal.

    python -m source_code.profiling.scaling                  # 1 and 2 processes (this laptop)
    python -m source_code.profiling.scaling --procs 1,2,4,8  # a GPU node: one process per GPU

* strong scaling: the GLOBAL batch stays fixed; n processes should finish a step n times faster.
  efficiency = t_1 / (n * t_n) = thr_n / (n * thr_1)
* weak scaling: the batch PER PROCESS stays fixed; n processes do n times the work per step in
  the same time. efficiency = t_1 / t_n = thr_n / (n * thr_1)
(t: time per step, thr: samples/s.) In samples/s both read the same; what differs is the work.

Every row runs on the same kind of device, and the table's first line says which
(measure.table_device): one GPU per process when the node has a GPU for each process
of the largest count, otherwise every count on the CPU ("device: cpu (1 GPU < 2 processes)"):
a ratio of GPU samples/s to CPU samples/s would say nothing about scaling.
"""
from __future__ import annotations

import statistics

from source_code import processes
from source_code.cli import Parser, positive_int
from source_code.errors import LaunchError, run_main
from source_code.measure import table_device
from source_code.profiling import throughput


def strong_efficiency(t_1: float, t_n: float, n: int) -> float:
    """Fixed global batch: step time t_1 on one process, t_n on n processes."""
    return t_1 / (n * t_n)


def weak_efficiency(t_1: float, t_n: float) -> float:
    """Fixed batch per process: step time t_1 on one process, t_n on n (n times the work)."""
    return t_1 / t_n


def throughput_efficiency(thr_1: float, thr_n: float, n: int) -> float:
    """Either kind from samples/s: the share of n x the one-process throughput reached."""
    return thr_n / (n * thr_1)


def run(procs=(1, 2), batch: int = 64, steps: int = 20, extra=(), repeats: int = 1) -> dict:
    """Measure throughput.py's DDP step for every process count, strong (global batch ``batch``)
    and weak (``batch`` per process), all on one kind of device; returns {"strong": {n: result},
    "weak": {n: result}, "device": "device: ... (why)"}. With ``repeats`` > 1 every run is
    made that many times, the rounds interleaved, and the fastest of each kept: a run slowed by
    another program on a shared machine then does not stand for its process count. Each kept
    run also carries ``round_step_cpu_ms``: rank 0's CPU per step of its count in every round,
    in order, for ``cpu_ratio`` to compare counts round by round. The ranks
    fork from the fork server (processes.spawn): fresh processes, as torchrun's, that start in
    a fraction of a second, so a round costs its steps, not its launches."""
    device, line = table_device(procs)
    out: dict = {"strong": {}, "weak": {}, "device": line}
    cpu_ms: dict = {}   # (kind, n) -> rank 0's CPU per step, one a round
    for n in procs:
        if batch % n:
            raise LaunchError(f"error: batch {batch} does not divide among {n} processes")
    for _ in range(repeats):
        for n in procs:
            for kind, flag in (("weak", "--per-rank-batch"), ("strong", "--global-batch")):
                if n == 1 and kind == "strong":
                    continue  # one process: strong and weak are the same run
                s = processes.spawn(throughput.measure_spawned, n,
                                    [flag, batch, "--steps", steps, "--quiet", *extra],
                                    timeout=300, device=device)[0]
                cpu_ms.setdefault((kind, n), []).append(s["step_cpu_ms"])
                if n not in out[kind] or s["samples_per_s"] > out[kind][n]["samples_per_s"]:
                    out[kind][n] = s
    for (kind, n), rounds in cpu_ms.items():
        out[kind][n]["round_step_cpu_ms"] = rounds
    out["strong"][procs[0]] = out["weak"][procs[0]]
    return out


def efficiencies(result: dict) -> dict:
    """{"strong": {n: efficiency}, "weak": {n: efficiency}} against the smallest run (n = 1)."""
    eff = {}
    for kind in ("strong", "weak"):
        by_n = result[kind]
        n1 = min(by_n)
        eff[kind] = {n: throughput_efficiency(by_n[n1]["samples_per_s"], s["samples_per_s"], n // n1)
                     for n, s in sorted(by_n.items())}
    return eff


def cpu_ratio(a: dict, b: dict) -> float:
    """Rank 0's CPU per step of run ``a`` over run ``b``: the median over the rounds of the two
    runs of one round (``run`` starts them one after the other, so what else the machine does
    weighs on the two of a round more alike than on runs of different rounds), or their
    ``step_cpu_ms`` where no rounds were kept."""
    if "round_step_cpu_ms" in a and "round_step_cpu_ms" in b:
        return statistics.median(x / y for x, y in zip(a["round_step_cpu_ms"], b["round_step_cpu_ms"],
                                                       strict=True))
    return a["step_cpu_ms"] / b["step_cpu_ms"]


def cpu_efficiencies(result: dict) -> dict:
    """The same efficiencies from rank 0's CPU time per step (``cpu_ratio``) instead of the
    clock: the work a sample costs on n processes against one, which waiting for a core that
    other programs hold does not change. Strong: c_1 / (n c_n); weak: c_1 / c_n."""
    eff = {}
    for kind in ("strong", "weak"):
        by_n = result[kind]
        n1 = min(by_n)
        eff[kind] = {n: cpu_ratio(by_n[n1], s) / (n // n1 if kind == "strong" else 1)
                     for n, s in sorted(by_n.items())}
    return eff


def table(result: dict) -> str:
    eff = efficiencies(result)
    lines = [result["device"]] if "device" in result else []
    lines += [f"{'scaling':8s} {'procs':>5s} {'global batch':>12s} {'samples/s':>10s} {'efficiency':>10s}"]
    for kind in ("strong", "weak"):
        for n, s in sorted(result[kind].items()):
            lines.append(f"{kind:8s} {n:5d} {s['global_batch']:12d} {s['samples_per_s']:10.0f} "
                         f"{eff[kind][n]:10.2f}")
    return "\n".join(lines)


def main(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--procs", default="1,2", help="comma-separated process counts, starting at 1")
    p.add_argument("--batch", type=positive_int, default=64,
                   help="global batch (strong) and per-process batch (weak)")
    p.add_argument("--steps", type=positive_int, default=20)
    p.add_argument("--repeats", type=positive_int, default=1, help="runs per count, the fastest kept")
    args = p.parse_args(argv)
    try:
        procs = tuple(int(x) for x in args.procs.split(","))
    except ValueError:
        raise LaunchError(f"error: --procs {args.procs!r}: give counts like 1,2,4") from None
    if not procs or procs[0] != 1 or any(n < 1 for n in procs):
        raise LaunchError("error: --procs must start with 1 (the baseline), e.g. --procs 1,2,4")
    print(table(run(procs, args.batch, args.steps, repeats=args.repeats)))
    return 0


if __name__ == "__main__":
    run_main(main)
