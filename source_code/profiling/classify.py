"""Which profiler events are communication and which are computation: one function decides.

On CPU with gloo a collective shows up twice: ``c10d::allreduce_`` on the main thread (the call
that enqueues it, short) and ``gloo:all_reduce`` on one of gloo's worker threads (the transfer
itself, asynchronous: it overlaps the backward). On a GPU with NCCL the same call appears as
``nccl:all_reduce`` plus the ``ncclDevKernel_*`` kernels on the GPU stream, and
``record_param_comms`` wraps each collective. ``kind_of`` maps every operator name to
"communication", "annotation" (spans that only group other events: ProfilerStep#3,
DistributedDataParallel.forward, Optimizer.step...) or "computation". ``op_rows`` adds up
host (CPU) self time, or the GPU's time where the profile recorded CUDA activity (``clock``);
``per_step`` turns the profiler's totals over the active steps into means per step.

An annotation has self time too: the time inside it that no recorded operator covers (Python,
waiting). ``ProfilerStep*``'s self time is the main thread's time outside every operator of the
step; ``step_breakdown`` reads from the trace how much of it was spent while a collective was in
flight (DDP waiting at the end of the backward for the last bucket's all-reduce).
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
def device_us(ev) -> float:
    """An event's self time on the GPU in µs: ``self_device_time_total`` (torch >= 2.4),
    ``self_cuda_time_total`` in older ones; 0 where no device time was recorded."""
    value = getattr(ev, "self_device_time_total", None)
    if value is None:
        value = getattr(ev, "self_cuda_time_total", 0)
    return float(value or 0)


def on_device(ev) -> bool:
    """A device-side event (a kernel, a copy on the GPU) rather than a host operator."""
    kind = getattr(ev, "device_type", None)
    return kind is not None and str(kind).rsplit(".", 1)[-1] != "CPU"


def op_rows(key_averages) -> list[dict]:
    """One dict per operator of ``prof.key_averages()``: name, kind, calls, times in ms.

    ``time_ms`` is what the kind totals add up, and ``clock`` says which time it is:

    * "host" (no GPU activity recorded): the self time on the CPU (the operator without its
      children: no double counting), except for the asynchronous collectives (``gloo:...``,
      ``nccl:...``), whose whole duration counts;
    * "device" (CUDA activity recorded): the GPU's time. There the host times are the cost of
      launching kernels, not of running them. Each kernel (and GPU copy) is a row of its own
      and counts once; its launching operator shows the same time in ``self_device_ms`` but
      counts 0 (it would count twice). Where the profiler gives no kernel rows, only operators
      with device time, those count.
    """
    events = list(key_averages)
    device = any(device_us(ev) > 0 for ev in events)
    kernels = any(on_device(ev) and device_us(ev) > 0 for ev in events)
    rows = []
    for ev in events:
        dev_ms = device_us(ev) / 1e3
        self_ms, total_ms = ev.self_cpu_time_total / 1e3, ev.cpu_time_total / 1e3
        if device:
            time_ms = dev_ms if on_device(ev) or not kernels else 0.0
        else:
            time_ms = total_ms if ev.key.lower().startswith(ASYNC_COLLECTIVE) else self_ms
        rows.append({"name": ev.key, "kind": kind_of(ev.key), "calls": ev.count,
                     "time_ms": time_ms, "self_ms": self_ms, "total_ms": total_ms,
                     "self_device_ms": dev_ms, "clock": "device" if device else "host"})
    return sorted(rows, key=lambda r: -r["time_ms"])


def per_step(rows: list[dict], steps: int) -> list[dict]:
    """The rows with calls and times divided by ``steps``: means per profiled step."""
    keys = ("calls", "time_ms", "self_ms", "total_ms", "self_device_ms")
    return [{**r, **{k: r[k] / steps for k in keys}} for r in rows]


def clock(rows: list[dict]) -> str:
    """Which time ``time_ms`` is in these rows: "device" (GPU) or "host" (CPU self time)."""
    return rows[0]["clock"] if rows else "host"


def totals(rows: list[dict]) -> dict:
    """``time_ms`` summed per kind."""
    out = {"computation": 0.0, "communication": 0.0, "annotation": 0.0}
    for r in rows:
        out[r["kind"]] += r["time_ms"]
    return out


def format_table(rows: list[dict], top: int = 15, unit: str = "ms") -> str:
    """The ``top`` operators by time, with their kind, as fixed-width text; ``unit`` names what
    the numbers are ("ms per step" for the rows of ``per_step``)."""
    lines = [f"{'operator':40s} {'kind':13s} {'calls':>5s} {'time':>8s} {'self':>8s} {'total':>8s}   ({unit})"]
    for r in rows[:top]:
        lines.append(f"{r['name'][:40]:40s} {r['kind']:13s} {r['calls']:5g} {r['time_ms']:8.2f} "
                     f"{r['self_ms']:8.2f} {r['total_ms']:8.2f}")
    t = totals(rows)
    if clock(rows) == "device":
        why = ("GPU time: every kernel once; collectives' kernels run on NCCL's own stream, so they "
               "may run alongside the computation; 'self' is the host's launch time")
    else:
        why = ("host self time; a collective counts its whole time in flight on gloo's thread, which "
               "may or may not overlap the computation: the trace says how much")
    lines.append(f"time by kind: computation {t['computation']:.2f} {unit}, communication "
                 f"{t['communication']:.2f} {unit} ({why})")
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


DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")  # what ran on the GPU itself


def intervals(trace: dict) -> dict[str, list[tuple[float, float]]]:
    """(start_us, end_us) of the trace's complete events, per kind, merged where they overlap.

    On the CPU, computation: operator events (category cpu_op); communication: every event
    ``kind_of`` calls so (gloo's ``gloo:all_reduce`` is a user_annotation on a worker thread).
    A trace with GPU activity counts only what ran on the GPU (kernels, copies): the host's
    events there are launches. A merged interval says "this rank was computing" or "a
    collective was in flight".
    """
    raw: dict[str, list[tuple[float, float]]] = {"computation": [], "communication": []}
    events = [ev for ev in trace.get("traceEvents", []) if ev.get("ph") == "X"]
    device = any(ev.get("cat") in DEVICE_CATEGORIES for ev in events)
    for ev in events:
        kind = kind_of(ev.get("name", ""))
        if device and ev.get("cat") not in DEVICE_CATEGORIES:
            continue
        if not device and kind == "computation" and ev.get("cat") != "cpu_op":
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


def overlap_us(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Length of the intersection of two merged span lists: [(0, 4)] and [(2, 6)] -> 2."""
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def gaps(windows: list[tuple[float, float]], busy: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The parts of ``windows`` that no span of ``busy`` (merged) covers."""
    out = []
    for start, end in windows:
        cur = start
        for a, b in busy:
            if b <= cur or a >= end:
                continue
            if a > cur:
                out.append((cur, a))
            cur = max(cur, b)
        if cur < end:
            out.append((cur, end))
    return out


def step_breakdown(trace: dict) -> dict:
    """Means per profiled step (ms) read from one rank's trace, within its ProfilerStep windows:

    * step: the step's length; computing: some operator ran; communicating: a collective was
      in flight; overlap: both at once (communication hidden under computation);
    * main_idle: the main thread outside every recorded event (``ProfilerStep*``'s self time);
      main_idle_comm: the part of it while a collective was in flight (the main thread waiting
      for it, as DDP does at the end of the backward for the last bucket).
    """
    windows = step_windows(trace)
    n = max(len(windows), 1)
    spans = {k: merge([(max(a, w0), min(b, w1)) for a, b in v for w0, w1 in windows if a < w1 and b > w0])
             for k, v in intervals(trace).items()}
    steps_ev = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"
                and str(e.get("name", "")).startswith("ProfilerStep#")]
    main = steps_ev[0].get("tid") if steps_ev else None
    busy = merge([(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)))
                  for e in trace.get("traceEvents", []) if e.get("ph") == "X" and e.get("tid") == main
                  and not str(e.get("name", "")).startswith("ProfilerStep#")])
    idle = gaps(windows, busy)
    ms = lambda us: us / 1e3 / n  # noqa: E731
    return {"steps": len(windows), "step": ms(busy_us(windows)),
            "computing": ms(busy_us(spans["computation"])),
            "communicating": ms(busy_us(spans["communication"])),
            "overlap": ms(overlap_us(spans["computation"], spans["communication"])),
            "main_idle": ms(busy_us(idle)), "main_idle_comm": ms(overlap_us(idle, spans["communication"]))}
