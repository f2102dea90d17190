"""Figures of notebook 12, drawn from the mesh object and from real DTensor parameters.

    fig = mesh_figure(info)        # info = layout.describe() of rank 0
    save_figure(fig, "12_mesh.png")   # images/ only when WORKSHOP_EXPORT_FIGURES=1
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap

from source_code.figures import export as save_figure  # noqa: F401

RANK_COLORS = ["tab:blue", "tab:orange", "tab:green", "tab:red",
               "tab:purple", "tab:brown", "tab:pink", "tab:gray"]


def draw_grid(ax, grid, dim_names) -> None:
    """The mesh as a grid of rank numbers: rows = first dimension, columns = second."""
    grid = np.asarray(grid)
    rows, cols = grid.shape
    for i in range(rows):
        for j in range(cols):
            r = int(grid[i, j])
            ax.add_patch(plt.Rectangle((j, i), 0.92, 0.92, color=RANK_COLORS[r % 8], alpha=0.85))
            ax.text(j + 0.46, i + 0.46, f"rank {r}\n({dim_names[0]}={i}, {dim_names[1]}={j})",
                    ha="center", va="center", color="white", fontsize=9)
    ax.set_xlim(-0.1, cols)
    ax.set_ylim(rows, -0.35)
    ax.set_xticks([c + 0.46 for c in range(cols)], [f"{dim_names[1]}={c}" for c in range(cols)])
    ax.set_yticks([r + 0.46 for r in range(rows)], [f"{dim_names[0]}={r}" for r in range(rows)])
    ax.set_title(f"mesh.mesh: a row is a {dim_names[1]} group,\na column a {dim_names[0]} group",
                 fontsize=10)
    ax.tick_params(length=0)
    for s in ax.spines.values():
        s.set_visible(False)


def draw_owners(ax, name: str, entry: dict, world: int) -> None:
    """Which rank holds each element of a 2-D parameter (its owner map)."""
    owners = np.asarray(entry["owners"])
    cmap = ListedColormap(RANK_COLORS[:world])
    ax.imshow(owners, cmap=cmap, vmin=-0.5, vmax=world - 0.5, aspect="auto", interpolation="nearest")
    ax.set_title(f"{name} {tuple(entry['shape'])}\n" + " x ".join(
        p.replace("_StridedShard", "StridedShard") for p in entry["placements"]), fontsize=9)
    ax.set_xlabel("column (input feature)")
    ax.set_ylabel("row (output feature)")


def mesh_figure(info: dict, names=("layers.0.attn.wq.weight", "layers.0.attn.wo.weight")):
    """The 2 x 2 grid and the owner maps of two weights, colour = rank."""
    world = int(np.asarray(info["mesh"]).size)
    fig, axes = plt.subplots(1, 1 + len(names), figsize=(4 + 3.6 * len(names), 3.6),
                             gridspec_kw={"width_ratios": [1.1] + [1] * len(names)})
    draw_grid(axes[0], info["mesh"], info["dim_names"])
    for ax, name in zip(axes[1:], names):
        draw_owners(ax, name, info["params"][name], world)
    fig.tight_layout()
    return fig


def memory_bars(rows: dict, limit_gb: dict):
    """Stacked bars of bytes per GPU (GB) by term, one bar per plan; ``rows``: panel title ->
    {plan label -> memory dict}; ``limit_gb``: panel title -> usable GB (a dashed line).
    The axis ends at 1.8 x the usable memory; a taller bar is cut and its total written on it."""
    terms = ("params", "grads", "optimizer", "activations", "buffers")
    colors = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:gray")
    fig, axes = plt.subplots(1, len(rows), figsize=(4.2 * len(rows), 3.8), squeeze=False)
    for ax, (title, plans) in zip(axes[0], rows.items()):
        labels = list(plans)
        bottom = np.zeros(len(labels))
        for term, color in zip(terms, colors):
            vals = np.array([plans[k][term] / 1e9 for k in labels])
            ax.bar(range(len(labels)), vals, bottom=bottom, color=color, label=term)
            bottom += vals
        top = 1.8 * limit_gb[title]             # bars above it are cut: their total is written
        ax.axhline(limit_gb[title], color="black", linestyle="--", linewidth=1)
        for i, total in enumerate(bottom):
            ax.text(i, min(total, top * 0.93), f"{total:.0f} GB", ha="center", va="bottom", fontsize=8)
        ax.set_ylim(0, top)
        ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right", fontsize=8)
        ax.set_ylabel("GB per GPU")
        ax.set_title(title, fontsize=9)
    axes[0][-1].legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    return fig
