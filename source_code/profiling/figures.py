"""Figures of notebook 15, drawn from measurements: trace timelines, scaling, data loading."""
from __future__ import annotations

import matplotlib.pyplot as plt

from source_code.figures import export
from source_code.profiling import classify

COLORS = {"computation": "tab:blue", "communication": "tab:orange"}


def timeline_figure(traces: dict[int, dict], name: str | None = None):
    """One pair of rows per rank (computation, communication) over the active steps of its trace.

    All ranks of one machine share a clock, so the rows line up; time 0 is the earliest
    ProfilerStep start over the ranks. Step boundaries of rank 0 are drawn as dotted lines.
    """
    t0 = min(classify.step_windows(t)[0][0] for t in traces.values())
    fig, ax = plt.subplots(figsize=(10, 1.0 + 0.9 * len(traces)))
    labels, y = [], 0
    for rank in sorted(traces):
        spans = classify.intervals(traces[rank])
        for kind in ("computation", "communication"):
            bars = [((a - t0) / 1e3, (b - a) / 1e3) for a, b in spans[kind]]
            ax.broken_barh(bars, (y - 0.35, 0.7), color=COLORS[kind])
            labels.append(f"rank {rank} {'compute' if kind == 'computation' else 'all-reduce'}")
            y += 1
    for a, _ in classify.step_windows(traces[min(traces)]):
        ax.axvline((a - t0) / 1e3, color="grey", ls=":", lw=1)
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("time since the first profiled step (ms)")
    ax.set_title("profiled steps: computation (operators) and communication (gloo all-reduce in flight)")
    fig.tight_layout()
    export(fig, name)
    return fig


def scaling_figure(result: dict, efficiencies: dict, name: str | None = None):
    """samples/s against processes (with the ideal line) and efficiency, strong and weak."""
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.6))
    for kind, marker in (("strong", "o"), ("weak", "s")):
        ns = sorted(result[kind])
        thr = [result[kind][n]["samples_per_s"] for n in ns]
        a1.plot(ns, thr, marker=marker, label=f"{kind} scaling")
        a2.plot(ns, [efficiencies[kind][n] for n in ns], marker=marker, label=kind)
    ns = sorted(result["weak"])
    base = result["weak"][ns[0]]["samples_per_s"]
    a1.plot(ns, [base * n / ns[0] for n in ns], "k--", lw=1, label="ideal (n x one process)")
    a1.set(xlabel="processes", ylabel="samples/s", xticks=ns, title="throughput")
    a2.axhline(1.0, color="k", ls="--", lw=1)
    a2.set(xlabel="processes", ylabel="efficiency", xticks=ns, ylim=(0, 1.1), title="scaling efficiency")
    a1.legend()
    a2.legend()
    fig.tight_layout()
    export(fig, name)
    return fig


def loader_figure(runs: dict[str, dict], name: str | None = None):
    """Per configuration: median step time split into waiting for data and the rest (the rest
    names the all-reduce only where a run had more than one process: one process has none)."""
    fig, ax = plt.subplots(figsize=(7, 0.8 + 0.7 * len(runs)))
    several = any(r.get("world_size", 1) > 1 for r in runs.values())
    rest_label = f"forward, backward, {'all-reduce, ' if several else ''}optimizer step"
    for i, (label, r) in enumerate(runs.items()):
        wait, rest = r["data_wait_ms"], r["step_ms"] - r["data_wait_ms"]
        ax.barh(i, wait, color="tab:red", label="waiting for the DataLoader" if i == 0 else None)
        ax.barh(i, rest, left=wait, color="tab:blue", label=rest_label if i == 0 else None)
        ax.text(r["step_ms"] * 1.01, i, f"{r['samples_per_s']:,.0f} samples/s", va="center")
    ax.set_yticks(range(len(runs)), list(runs))
    ax.invert_yaxis()
    ax.set_xlabel("median step time (ms)")
    ax.set_xlim(0, 1.35 * max(r["step_ms"] for r in runs.values()))
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=2, fontsize=8, frameon=False)
    fig.tight_layout()
    export(fig, name)
    return fig
