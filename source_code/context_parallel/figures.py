"""Figures of notebook 13, drawn from runs (or, for the layouts, from the exact chunk count).

    save_figure(fig, "13_layouts.png")   # images/ only when WORKSHOP_EXPORT_FIGURES=1
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Patch

from source_code.context_parallel import layout as lay
from source_code.figures import export as save_figure  # noqa: F401  (images/ only when exporting)

COLORS = plt.get_cmap("tab10").colors
DIAGONAL_SHADE = 0.45      # a diagonal block is drawn this much as strong as a full one


def _tint(color, strength: float):
    return [1 - strength * (1 - x) for x in color]


def layouts_figure(world: int, work: dict, step_ms: dict | None = None):
    """Left/middle: which rank scores each (query chunk, key chunk) pair under a causal mask, on
    the 2n x 2n grid of chunks; right: pairs per rank as the kernel scored them (``work[layout]``)."""
    fig, axes = plt.subplots(1, 3, figsize=(12, 4.6))
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
                grid[qc, kc] = _tint(COLORS[owner[qc]], DIAGONAL_SHADE if kc == qc else 1.0)
        ax.imshow(grid, origin="upper")
        ax.set_title(f"{layout}: who scores which block (causal)")
        ax.set_xlabel("key chunk (of 2n)")
        ax.set_ylabel("query chunk (of 2n)")
        ax.set_xticks(range(parts))
        ax.set_yticks(range(parts))
    ax = axes[2]
    x = np.arange(world)
    for i, layout in enumerate(lay.LAYOUTS):
        ax.bar(x + (i - 0.5) * 0.4, work[layout], 0.4, label=layout, color=COLORS[i + 4])
    ax.set_xlabel("rank")
    ax.set_ylabel("query-key pairs scored (counted)")
    ax.set_xticks(x)
    ax.set_ylim(0, 1.3 * max(max(w) for w in work.values()))       # room for the legend above the bars
    title = f"work per rank, {world} ranks"
    if step_ms:
        title += "\nstep " + ", ".join(f"{k} {v:.1f} ms" for k, v in step_ms.items())
    ax.set_title(title)
    ax.legend(loc="upper left", ncol=2)
    key = [Patch(color=COLORS[r], label=f"rank {r}") for r in range(world)]
    key += [Patch(facecolor=_tint(COLORS[0], DIAGONAL_SHADE), edgecolor="0.5",
                  label="lighter: diagonal block, its lower triangle scored"),
            Patch(facecolor="white", edgecolor="0.5", label="white: skipped (keys after queries)")]
    fig.legend(handles=key, loc="lower center", ncol=len(key), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
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


def gantt_figure(modes: dict):
    """One forward + backward per rank, one panel per mode on one time axis (ms from the
    mode's first event). ``modes[mode] = {"spans": [rank r's compute spans], "exchanges":
    timing.transfer_split(...)'s rows of that step}``. Each exchange is drawn as the wait for a
    neighbour that had not posted yet (grey) and the time from when both had posted until the
    wait returned (green K/V, red dK/dV)."""
    world = len(next(iter(modes.values()))["spans"])
    fig, axes = plt.subplots(len(modes), 1, figsize=(11, 1.6 + 1.0 * world * len(modes)), sharex=True)
    for ax, (mode, rec) in zip(axes, modes.items()):
        t0 = min([s["start"] for spans in rec["spans"] for s in spans] + [e["post"] for e in rec["exchanges"]])
        ms = lambda a, b: ((a - t0) * 1e3, (b - a) * 1e3)                   # noqa: E731
        for r, spans in enumerate(rec["spans"]):
            for s in spans:
                ax.broken_barh([ms(s["start"], s["end"])], (2 * r + 1, 0.8),
                               color=COLORS[0] if s["phase"] == "forward" else COLORS[1])
        for e in rec["exchanges"]:
            y = 2 * e["rank"] + 0.1
            ax.broken_barh([ms(e["post"], e["start"])], (y, 0.8), color="0.75")
            ax.broken_barh([ms(e["start"], e["done"])], (y, 0.8), alpha=0.85,
                           color=COLORS[2] if e["what"] == "kv" else COLORS[3])
        ax.set_yticks([2 * r + 0.5 + k for r in range(world) for k in (0, 1)])
        ax.set_yticklabels([f"rank {r} {w}" for r in range(world) for w in ("send/recv", "compute")])
        ax.set_title(f"{mode}: one forward + backward of zigzag ring attention")
    axes[-1].set_xlabel("ms (one time axis for both panels)")
    key = [Patch(color=COLORS[0], label="compute, forward"), Patch(color=COLORS[1], label="compute, backward"),
           Patch(color="0.75", label="waiting for a neighbour to post"),
           Patch(color=COLORS[2], label="K/V: both posted until wait returned"),
           Patch(color=COLORS[3], label="dK/dV: both posted until wait returned")]
    fig.legend(handles=key, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    return fig
