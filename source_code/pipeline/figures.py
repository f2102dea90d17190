"""Figures of notebook 10, drawn from measured timestamps and simulated timelines.

    fig = gantt_figure({"GPipe": records, "1F1B": records2})
    save_figure(fig, "10_gantt.png")      # writes images/10_gantt.png only if WORKSHOP_EXPORT_FIGURES=1

``save_figure`` is the shared ``source_code.figures.export``: running the notebook (or its
tests) never rewrites the tracked copies in images/; export them with WORKSHOP_EXPORT_FIGURES=1.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from source_code.figures import export as save_figure  # noqa: F401  (images/ only when exporting)
from source_code.pipeline.formulas import bubble_theory

COLORS = {"F": "tab:blue", "B": "tab:orange", "W": "tab:green"}
KIND_NAMES = {"F": "forward", "B": "backward (split: input gradient)", "W": "weight gradient"}
SCHEDULE_COLORS = {"naive": "tab:gray", "gpipe": "tab:blue", "1f1b": "tab:green"}
RUN_MARKERS = {"held": ("o", "full"), "raw": ("s", "none"), "slow": ("^", "full")}


def _field(op, name, default=None):
    if isinstance(op, dict):
        return op.get(name, default)
    return getattr(op, name, default)


def gantt(ax, records, title: str = "", unit: float = 1e3, label_ops: bool = True):
    """Stages (rows, stage 0 on top) x time: forwards blue, backwards orange, weight gradients
    green, a rank's second chunk hatched, idle left white.

    ``records``: measured dicts or simulated Ops with stage, kind, mb, start, end (seconds for
    measured ones, shown in ms with unit=1e3; simulated ones with unit=1)."""
    p = 1 + max(_field(r, "stage") for r in records)
    for r in records:
        start, width = _field(r, "start") * unit, (_field(r, "end") - _field(r, "start")) * unit
        s, kind, chunk = _field(r, "stage"), _field(r, "kind"), _field(r, "chunk", 0)
        ax.barh(s, width, left=start, height=0.8, color=COLORS[kind], edgecolor="white", linewidth=0.5,
                hatch="///" if chunk else None, alpha=0.7 if chunk else 1.0)
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
    ops = [r for rs in panels.values() for r in rs]
    kinds = [k for k in COLORS if any(_field(r, "kind") == k for r in ops)]
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[k]) for k in kinds]
    names = [KIND_NAMES[k] if "W" in kinds else KIND_NAMES[k].split(" (")[0] for k in kinds]
    if any(_field(r, "chunk", 0) for r in ops):
        handles.append(plt.Rectangle((0, 0), 1, 1, facecolor="white", edgecolor="gray", hatch="///"))
        names.append("second chunk of a rank")
    fig.tight_layout()
    fig.legend(handles, names, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    return fig


def bubble_figure(report: dict):
    """Measured bubble (median over steps, every step faint) vs m for each run of bubble.py's
    report (raw, held, slow), the formula (p-1)/(m+p-1), and the simulator's slow-stage bubble."""
    p = report["p"]
    runs = report["runs"]
    fig, ax = plt.subplots(figsize=(7.5, 4.4))
    ms_all = sorted({int(m) for r in runs.values() for per_m in r["result"].values() for m in per_m})
    grid = np.linspace(min(ms_all), max(ms_all), 200)
    ax.plot(grid, [bubble_theory(p, m) for m in grid], "k-", lw=1, label=f"formula (p-1)/(m+p-1), p={p}")
    label = {"raw": "raw (as computed)",
             "held": "held (F {:.0f} ms, B {:.0f} ms, counted busy)",
             "slow": "slow stage {s}: held {f}x"}
    for k, (run, r) in enumerate(runs.items()):
        marker, fill = RUN_MARKERS.get(run, ("D", "full"))
        text = label.get(run, run)
        if run == "held":
            text = text.format(1e3 * report["hold"]["F"], 1e3 * report["hold"]["B"])
        elif run == "slow":
            text = text.format(s=report["slow"]["stage"], f=report["slow"]["factor"])
        for i, (name, per_m) in enumerate(r["result"].items()):
            ms = sorted(int(m) for m in per_m)
            shift = 1 + 0.05 * (2 * k + i - len(runs))  # side by side, so every series stays visible
            color = SCHEDULE_COLORS.get(name, "C3")
            vals = [per_m[str(m)]["bubbles"] if str(m) in per_m else per_m[m]["bubbles"] for m in ms]
            for m, v in zip(ms, vals):
                ax.scatter([m * shift] * len(v), v, s=6, alpha=0.3, color=color)
            ax.plot([m * shift for m in ms], [float(np.median(v)) for v in vals], marker, color=color,
                    fillstyle=fill, label=f"{name}, {text}")
            if run == "slow":
                sim = r["sim"][name]
                ax.plot([m * shift for m in ms], [sim[str(m)] if str(m) in sim else sim[m] for m in ms],
                        "_", color="k", ms=12, mew=1.5, label="simulator, slow stage" if i == 0 else None)
    ax.set(xscale="log", xlabel="microbatches m", ylabel="bubble = idle / (p x step time)",
           title=f"Pipeline bubble, p = {p} stages, measured: raw, held, one stage slower")
    ax.set_xticks(ms_all, [str(m) for m in ms_all])
    ax.xaxis.set_minor_formatter(plt.NullFormatter())
    ax.legend(fontsize=7)
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
