"""Figures of notebook 13, drawn from runs (or, for the layouts, from the exact chunk count).

    save_figure(fig, "13_layouts.png")   # images/ only when WORKSHOP_EXPORT_FIGURES=1
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from source_code.context_parallel import layout as lay
from source_code.figures import export as save_figure  # noqa: F401  (images/ only when exporting)

COLORS = plt.get_cmap("tab10").colors


def layouts_figure(world: int, work: dict, step_ms: dict | None = None):
    """Left/middle: which rank scores each (query chunk, key chunk) pair under a causal mask, on
    the 2n x 2n grid of chunks; right: pairs per rank counted (``work[layout]``)."""
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8))
    parts = 2 * world
    for ax, layout in zip(axes[:2], lay.LAYOUTS):
        grid = np.full((parts, parts, 3), 1.0)
        owner = {}
        for r in range(world):
            for c in lay.chunk_ids(r, world, layout):
                cs = (c,) if layout == "zigzag" else (2 * c, 2 * c + 1)   # contiguous: 2 of the 2n chunks
                for cc in cs:
                    owner[cc] = r
        for qc in range(parts):
            for kc in range(qc + 1):
                shade = 0.55 if kc == qc else 1.0
                grid[qc, kc] = [1 - shade * (1 - x) for x in COLORS[owner[qc]]]
        ax.imshow(grid, origin="upper")
        ax.set_title(f"{layout}: who scores which block (causal)")
        ax.set_xlabel("key chunk")
        ax.set_ylabel("query chunk")
        ax.set_xticks(range(parts))
        ax.set_yticks(range(parts))
    ax = axes[2]
    x = np.arange(world)
    for i, layout in enumerate(lay.LAYOUTS):
        ax.bar(x + (i - 0.5) * 0.4, work[layout], 0.4, label=layout, color=COLORS[i + 4])
    ax.set_xlabel("rank")
    ax.set_ylabel("query-key pairs scored")
    ax.set_xticks(x)
    title = f"work per rank, {world} ranks"
    if step_ms:
        title += "\nstep " + ", ".join(f"{k} {v:.1f} ms" for k, v in step_ms.items())
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    return fig


def memory_figure(full_rows: list[dict], cp: dict):
    """Saved bytes of one block forward vs sequence length: one process (memory.full_report:
    naive and fused attention) and per rank with CP (``cp``: {world: cp_report of rank 0})."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    seqs = [row["seq"] for row in full_rows]
    for ax, suffix, title in ((axes[0], "", "one block"), (axes[1], "_core", "attention core only")):
        mib = lambda key, rows: [row[key + suffix] / 2**20 for row in rows]  # noqa: E731
        ax.plot(seqs, mib("full_naive", full_rows), "o-", label="1 process, scores kept")
        ax.plot(seqs, mib("full_sdpa", full_rows), "s-", label="1 process, fused SDPA")
        for world, rep in cp.items():
            ax.plot([row["seq"] for row in rep["rows"]], mib("cp", rep["rows"]), "^--",
                    label=f"ring attention, per rank of {world}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length t")
        ax.set_ylabel("MiB saved for backward")
        ax.set_title(title)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def gantt_figure(timelines: list[dict]):
    """Per rank: compute spans and transfers (post -> wait returned) of one forward + backward,
    overlapped (top) and serialized (bottom); ``timelines[r]`` is rank r's overlap()['timeline']."""
    fig, axes = plt.subplots(2, 1, figsize=(11, 1.2 + 1.1 * len(timelines) * 2), sharex=False)
    for ax, mode in zip(axes, ("overlapped", "serialized")):
        t0 = min(min(c["start"] for c in tl[mode]["computes"]) for tl in timelines)
        for r, tl in enumerate(timelines):
            y = 2 * r
            for c in tl[mode]["computes"]:
                ax.broken_barh([((c["start"] - t0) * 1e3, (c["end"] - c["start"]) * 1e3)], (y + 1, 0.8),
                               color=COLORS[0] if c["phase"] == "forward" else COLORS[1])
            for e in tl[mode]["events"]:
                ax.broken_barh([((e["post"] - t0) * 1e3, (e["done"] - e["post"]) * 1e3)], (y + 0.1, 0.8),
                               color=COLORS[2] if e["what"] == "kv" else COLORS[3], alpha=0.8)
        ax.set_yticks([2 * r + 0.5 + k for r in range(len(timelines)) for k in (0, 1)])
        ax.set_yticklabels([f"rank {r} {w}" for r in range(len(timelines)) for w in ("send/recv", "compute")])
        ax.set_xlabel("ms")
        ax.set_title(f"{mode}: compute (blue forward, orange backward), transfers (green K/V, red dK/dV)")
    fig.tight_layout()
    return fig
