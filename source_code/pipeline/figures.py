"""Figures of notebook 09, drawn from measured timestamps and simulated timelines.

    fig = gantt_figure({"GPipe": records, "1F1B": records2})
    save_figure(fig, "09_gantt.png")      # writes images/09_gantt.png only if WORKSHOP_EXPORT_FIGURES=1

``save_figure`` is the shared ``source_code.figures.export``: running the notebook (or its
tests) never rewrites the tracked copies in images/; export them with WORKSHOP_EXPORT_FIGURES=1.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from source_code.figures import export as save_figure  # noqa: F401  (images/ only when exporting)
from source_code.pipeline.formulas import bubble_theory

COLORS = {"F": "tab:blue", "B": "tab:orange"}
SCHEDULE_COLORS = {"naive": "tab:gray", "gpipe": "tab:blue", "1f1b": "tab:green"}


def _field(op, name):
    return op[name] if isinstance(op, dict) else getattr(op, name)


def gantt(ax, records, title: str = "", unit: float = 1e3, label_ops: bool = True):
    """Stages (rows, stage 0 on top) x time: forwards blue, backwards orange, idle left white.

    ``records``: measured dicts or simulated Ops with stage, kind, mb, start, end (seconds for
    measured ones, shown in ms with unit=1e3; simulated ones with unit=1)."""
    p = 1 + max(_field(r, "stage") for r in records)
    for r in records:
        start, width = _field(r, "start") * unit, (_field(r, "end") - _field(r, "start")) * unit
        s, kind = _field(r, "stage"), _field(r, "kind")
        ax.barh(s, width, left=start, height=0.8, color=COLORS[kind], edgecolor="white", linewidth=0.5)
        if label_ops:
            ax.text(start + width / 2, s, f"{kind}{_field(r, 'mb')}", ha="center", va="center",
                    fontsize=7, color="white", clip_on=True)
    ax.set_yticks(range(p), [f"stage {s}" for s in range(p)])
    ax.set_ylim(p - 0.5, -0.5)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("time (ms)" if unit == 1e3 else "time (units)")
    return ax


def gantt_figure(panels: dict, unit: float = 1e3, sharex: bool = True, label_ops: bool = True):
    """One Gantt chart per entry of ``panels`` (title -> records), stacked, one time axis."""
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 1.1 + 0.9 * len(panels) *
                                                      (1 + max(_field(r, "stage") for rs in panels.values() for r in rs)) / 2),
                             sharex=sharex, squeeze=False)
    for ax, (title, records) in zip(axes[:, 0], panels.items()):
        gantt(ax, records, title, unit, label_ops)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()]
    fig.tight_layout()
    fig.legend(handles, ["forward", "backward"], loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    return fig


def bubble_figure(table: dict, p: int):
    """Measured bubble (median over steps, with every step faint) vs m, and (p-1)/(m+p-1)."""
    fig, ax = plt.subplots(figsize=(6.5, 4))
    grid = np.linspace(1, max(max(int(m) for m in per_m) for per_m in table.values()), 200)
    ax.plot(grid, [bubble_theory(p, m) for m in grid], "k-", lw=1, label=f"theory (p-1)/(m+p-1), p={p}")
    for i, (name, per_m) in enumerate(table.items()):
        ms = [int(m) for m in per_m]
        shift = (i - 0.5) * 0.08  # side by side, so both schedules stay visible
        for m in ms:
            vals = per_m[m]["bubbles"] if m in per_m else per_m[str(m)]["bubbles"]
            ax.scatter([m * (1 + shift)] * len(vals), vals, s=8, alpha=0.35,
                       color=SCHEDULE_COLORS.get(name, "C3"))
        med = [float(np.median(per_m[m]["bubbles"] if m in per_m else per_m[str(m)]["bubbles"])) for m in ms]
        ax.plot([m * (1 + shift) for m in ms], med, "o", color=SCHEDULE_COLORS.get(name, "C3"),
                label=f"{name}, measured (median)")
    ax.set(xscale="log", xlabel="microbatches m", ylabel="bubble = idle / (p x step time)",
           title=f"Pipeline bubble, p = {p} stages (measured vs formula)")
    ax.set_xticks([1, 2, 4, 8], ["1", "2", "4", "8"])
    ax.xaxis.set_minor_formatter(plt.NullFormatter())
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def memory_figure(peak_bytes: dict, counts: dict):
    """Stored activation bytes per stage (bars) for each schedule, microbatch counts written on top."""
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    names = list(peak_bytes)
    p = len(peak_bytes[names[0]])
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        xs = np.arange(p) + (i - (len(names) - 1) / 2) * width
        ax.bar(xs, np.array(peak_bytes[name]) / 2**20, width, label=name,
               color=SCHEDULE_COLORS.get(name, "C3"))
        for x, b, c in zip(xs, peak_bytes[name], counts[name]):
            ax.text(x, b / 2**20, f"{c} mb", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(p), [f"stage {s}" for s in range(p)])
    ax.set(ylabel="peak stored activations (MiB)", title="Activation memory per stage (measured)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def step_time_figure(step_s: dict):
    """Median step time per schedule (bars), every step as a dot."""
    fig, ax = plt.subplots(figsize=(8, 3.4))
    names = list(step_s)
    for i, name in enumerate(names):
        ms = np.array(step_s[name]) * 1e3
        ax.bar(i, np.median(ms), color="tab:green" if not name.startswith("lib") else "tab:purple")
        ax.scatter([i] * len(ms), ms, s=8, color="k", zorder=3)
    ax.set_xticks(range(len(names)), names, rotation=20, fontsize=8)
    ax.set(ylabel="step time (ms)", title="Own schedules (green) vs torch.distributed.pipelining (purple), one run")
    fig.tight_layout()
    return fig
