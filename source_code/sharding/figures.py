"""Figures of notebook 09, drawn from real runs (exported with source_code.figures.export)."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

COLORS = {"params": "tab:blue", "grads": "tab:orange", "optimizer": "tab:green"}


def memory_figure(rows: list[dict]):
    """Stacked bars of counted per-rank bytes (params, grads, optimizer), predicted as a tick,
    one group per world size; peak process memory as dots on a second axis."""
    sizes = sorted({r["world_size"] for r in rows})
    strategies = list(dict.fromkeys(r["strategy"] for r in rows))
    fig, ax = plt.subplots(figsize=(10, 4.2))
    width = 0.8 / len(strategies)
    mib = 2 ** 20
    for g, n in enumerate(sizes):
        for k, s in enumerate(strategies):
            r = next(r for r in rows if r["world_size"] == n and r["strategy"] == s)
            x = g + (k - (len(strategies) - 1) / 2) * width
            bottom = 0.0
            for key in ("params", "grads", "optimizer"):
                ax.bar(x, r[key] / mib, width * 0.9, bottom=bottom, color=COLORS[key],
                       label=key if (g, k) == (0, 0) else None)
                bottom += r[key] / mib
            ax.plot([x - width * 0.45, x + width * 0.45], [r["pred_total"] / mib] * 2, "k-", lw=2,
                    label="predicted (memory_model.py)" if (g, k) == (0, 0) else None)
            ax.text(x, bottom + 0.3, s.replace("fsdp_keep", "fsdp\nkeep"), ha="center",
                    va="bottom", fontsize=7, rotation=90)
    ax.set_xticks(range(len(sizes)), [f"N = {n}" for n in sizes])
    ax.set_ylabel("MiB per rank (counted tensors)")
    ax.set_ylim(0, max(r["total"] for r in rows) / mib * 1.35)
    ax.set_title("Per-rank training state: DDP, ZeRO-1, ZeRO-2, FSDP (reshard on / keep)")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    return fig


def comm_figure(rows: list[dict]):
    """Bytes each rank sends per step, counted vs the formula, for N > 1."""
    rows = [r for r in rows if r["world_size"] > 1]
    labels = [f"{r['strategy']}\nN={r['world_size']}" for r in rows]
    fig, ax = plt.subplots(figsize=(10, 3.2))
    x = np.arange(len(rows))
    ax.bar(x, [r["wire_bytes"] / 2 ** 20 for r in rows], 0.6, label="counted collectives")
    ax.plot(x, [r["pred_wire_bytes"] / 2 ** 20 for r in rows], "k_", ms=22, mew=2, label="formula")
    ax.set_xticks(x, labels, fontsize=7)
    ax.set_ylabel("MiB sent per rank per step")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
