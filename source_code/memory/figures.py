"""Figures of notebook 08, drawn from its runs (exported to images/ by source_code.figures.export)."""
from __future__ import annotations

import matplotlib.pyplot as plt

MIB = 2 ** 20


def terms_figure(terms: dict, counted: dict, title: str = ""):
    """Stacked bars: bytes per token of one block, term by term, per precision mode.

    ``terms``: {mode: [(name, bytes per token, cut)]} (formula.block_terms); ``counted``:
    {mode: counted bytes per token} drawn as a marker on each bar."""
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    modes = list(terms)
    names = [n for n, _, _ in terms[modes[0]]]
    colors = plt.get_cmap("tab20").colors
    for i, mode in enumerate(modes):
        bottom = 0.0
        for j, (name, n, _) in enumerate(terms[mode]):
            ax.bar(i, n, bottom=bottom, color=colors[j % len(colors)],
                   label=name if i == 0 else None, edgecolor="white", linewidth=0.5)
            bottom += n
        ax.plot(i, counted[mode], "k_", markersize=30, markeredgewidth=2,
                label="counted (saved-tensor hooks)" if i == 0 else None)
    ax.set_xticks(range(len(modes)), modes)
    ax.set_ylabel("bytes per token, one block")
    ax.set_title(title or "What one block keeps for backward")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    return fig


def recompute_figure(runs: dict):
    """Per configuration and recomputation mode, relative to no recomputation: (left) the peak
    and what is still allocated after forward; (right) the FLOPs of a step (counted) and its
    time (measured). ``runs``: {label: recompute.measure(...)}; both panels share the y scale."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    labels = list(runs)
    modes = list(runs[labels[0]])
    width = 0.8 / len(labels)
    x = range(len(modes))
    shades = [("#4477aa", "#88ccee"), ("#aa3377", "#ee99bb")]
    for i, label in enumerate(labels):
        rows = runs[label]
        at = [m + (i - (len(labels) - 1) / 2) * width for m in x]
        dark, light = shades[i % len(shades)]
        a.bar(at, [rows[m]["peak_ratio"] for m in modes], width, color=dark, label=f"{label}: peak")
        a.bar(at, [rows[m]["after_forward"] / rows["none"]["after_forward"] for m in modes], width * 0.5,
              color=light, label=f"{label}: kept after forward")
        b.bar(at, [rows[m]["flops_ratio"] for m in modes], width * 0.5, color=dark, align="edge",
              label=f"{label}: FLOPs (counted)")
        b.bar(at, [rows[m]["time_ratio"] for m in modes], -width * 0.5, color=light, align="edge",
              hatch="//", edgecolor="white", label=f"{label}: step time (this run)")
    for ax, title in ((a, "memory"), (b, "cost")):
        ax.axhline(1.0, color="k", linewidth=0.8, label="no recomputation = 1")
        ax.set_xticks(list(x), modes)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, frameon=False)
    a.set_ylabel("relative to no recomputation")
    fig.suptitle("Activation checkpointing: memory for compute")
    fig.tight_layout()
    return fig


def timeline_figure(times, allocated, marks: dict | None = None):
    """The CUDA allocator's allocated bytes over the trace of a memory snapshot (gpu.py)."""
    fig, ax = plt.subplots(figsize=(7.5, 3.2))
    ax.plot(range(len(allocated)), [v / MIB for v in allocated], linewidth=1)
    for label, (start, stop) in (marks or {}).items():
        ax.axvspan(start, stop, alpha=0.12)
        ax.text((start + stop) / 2, ax.get_ylim()[1] * 0.95, label, ha="center", va="top", fontsize=8)
    ax.set_xlabel("allocator event")
    ax.set_ylabel("MiB allocated")
    ax.set_title("torch.cuda.memory._record_memory_history: one step per mode")
    fig.tight_layout()
    return fig
