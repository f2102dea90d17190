"""Which profiler events are communication and which are computation: one function decides.

On CPU with gloo a collective shows up twice: ``c10d::allreduce_`` on the main thread (the call
that enqueues it, short) and ``gloo:all_reduce`` on one of gloo's worker threads (the transfer
itself, asynchronous: it overlaps the backward). On a GPU with NCCL the same call appears as
``nccl:all_reduce`` plus the ``ncclDevKernel_*`` kernels on the GPU stream, and
``record_param_comms`` wraps each collective. ``kind_of`` maps every operator name to
"communication", "annotation" (spans that only group other events: ProfilerStep#3,
DistributedDataParallel.forward, Optimizer.step...) or "computation".
"""
from __future__ import annotations

import json
from pathlib import Path

COMMUNICATION = ("gloo:", "nccl:", "c10d::", "record_param_comms", "nccldevkernel", "ncclkernel",
                 "all_reduce", "allreduce", "all_gather", "allgather", "reduce_scatter",
                 "broadcast", "barrier", "alltoall", "all_to_all")
ANNOTATION = ("profilerstep", "distributeddataparallel.", "optimizer.", "enumerate(dataloader)",
              "data to device")
# collectives that run on the backend's own thread (gloo) or stream (NCCL): the profiler gives
# them no self time on the CPU, their duration is the time the transfer was in flight
ASYNC_COLLECTIVE = ("gloo:", "nccl:")


def kind_of(name: str) -> str:
    """"communication", "annotation" or "computation" for one operator or trace event name."""
    low = name.lower()
    if any(m in low for m in COMMUNICATION):
        return "communication"
    if any(low.startswith(m) for m in ANNOTATION):
        return "annotation"
    return "computation"


# ------------------------------------------------------------------ the per-operator table
def op_rows(key_averages) -> list[dict]:
    """One dict per operator of ``prof.key_averages()``: name, kind, calls, times in ms.

    ``time_ms`` is what the kind totals add up: the self time (the operator without its
    children: no double counting), except for the asynchronous collectives (``gloo:...``,
    ``nccl:...``), whose whole duration counts. Times are host (CPU) times; on a GPU the
    device times come in ``self_device_ms``.
    """
    rows = []
    for ev in key_averages:
        dev = getattr(ev, "self_device_time_total", getattr(ev, "self_cuda_time_total", 0.0))
        self_ms, total_ms = ev.self_cpu_time_total / 1e3, ev.cpu_time_total / 1e3
        in_flight = ev.key.lower().startswith(ASYNC_COLLECTIVE)
        rows.append({"name": ev.key, "kind": kind_of(ev.key), "calls": ev.count,
                     "time_ms": total_ms if in_flight else self_ms, "self_ms": self_ms,
                     "total_ms": total_ms, "self_device_ms": dev / 1e3})
    return sorted(rows, key=lambda r: -r["time_ms"])


def totals(rows: list[dict]) -> dict:
    """``time_ms`` summed per kind."""
    out = {"computation": 0.0, "communication": 0.0, "annotation": 0.0}
    for r in rows:
        out[r["kind"]] += r["time_ms"]
    return out


def format_table(rows: list[dict], top: int = 15) -> str:
    """The ``top`` operators by time, with their kind, as fixed-width text."""
    lines = [f"{'operator':40s} {'kind':13s} {'calls':>5s} {'time ms':>8s} {'self ms':>8s} {'total ms':>8s}"]
    for r in rows[:top]:
        lines.append(f"{r['name'][:40]:40s} {r['kind']:13s} {r['calls']:5d} {r['time_ms']:8.2f} "
                     f"{r['self_ms']:8.2f} {r['total_ms']:8.2f}")
    t = totals(rows)
    lines.append(f"time by kind: computation {t['computation']:.1f} ms, communication "
                 f"{t['communication']:.1f} ms (collectives in flight on gloo's threads overlap "
                 "the computation)")
    return "\n".join(lines)


# ------------------------------------------------------------------ the Chrome/Perfetto trace
def load_trace(path) -> dict:
    """A trace written by ``prof.export_chrome_trace`` (plain or .gz) as a dict."""
    path = Path(path)
    if path.suffix == ".gz":
        import gzip
        with gzip.open(path, "rt") as f:
            return json.load(f)
    return json.loads(path.read_text())


def intervals(trace: dict) -> dict[str, list[tuple[float, float]]]:
    """(start_us, end_us) of the trace's complete events, per kind, merged where they overlap.

    Computation: operator events (categories cpu_op and kernel); communication: every event
    ``kind_of`` calls so (gloo's ``gloo:all_reduce`` is a user_annotation on a worker thread).
    A merged interval says "this rank was computing" or "a collective was in flight".
    """
    raw: dict[str, list[tuple[float, float]]] = {"computation": [], "communication": []}
    for ev in trace.get("traceEvents", []):
        if ev.get("ph") != "X":
            continue
        kind = kind_of(ev.get("name", ""))
        if kind == "computation" and ev.get("cat") not in ("cpu_op", "kernel"):
            continue
        if kind in raw:
            raw[kind].append((float(ev["ts"]), float(ev["ts"]) + float(ev.get("dur", 0))))
    return {k: merge(v) for k, v in raw.items()}


def merge(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Union of intervals, sorted: [(0, 2), (1, 3), (5, 6)] -> [(0, 3), (5, 6)]."""
    out: list[list[float]] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def busy_us(spans: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in spans)


def step_windows(trace: dict) -> list[tuple[float, float]]:
    """(start_us, end_us) of each ``ProfilerStep#N`` span: where the active steps lie."""
    return sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"]))
                  for e in trace.get("traceEvents", [])
                  if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#"))
