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


def recompute_figure(rows: dict):
    """Peak bytes of a step and step time, relative to no recomputation, per mode."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(8, 3.2))
    modes = list(rows)
    a.bar(modes, [rows[m]["peak"] / MIB for m in modes], color="#4477aa")
    a.bar(modes, [rows[m]["after_forward"] / MIB for m in modes], color="#88ccee",
          label="still allocated after forward")
    a.set_ylabel("MiB allocated during the step (peak)")
    a.legend(fontsize=8)
    b.bar(modes, [rows[m]["time_ratio"] for m in modes], color="#cc6677")
    b.axhline(1.0, color="k", linewidth=0.8)
    b.set_ylabel("step time / no recomputation")
    fig.suptitle("Activation checkpointing: memory for time (4 blocks)")
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
