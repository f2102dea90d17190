"""Figures of notebook 11, drawn from what the sharded modules and the ledger report.

    fig = ownership_figure([r["tp"]["layout"] for r in per_rank], block=0)
    save_figure(fig, "11_ownership.png")   # images/ only when WORKSHOP_EXPORT_FIGURES=1
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from source_code.figures import export as save_figure  # noqa: F401  (images/ only when exporting)

RANK_COLORS = plt.get_cmap("tab10").colors
WEIGHTS = ("attn.wq", "attn.wk", "attn.wv", "attn.wo", "mlp.up", "mlp.down")


def ownership_figure(layouts: list, block: int = 0):
    """Each weight matrix of one block (out x in, as nn.Linear stores it), coloured by the rank
    that holds each part: rows for column-parallel layers, columns for row-parallel ones.

    ``layouts``: one ``harness.layout`` dict per rank (read from the TP modules themselves)."""
    world = len(layouts)
    fig, axes = plt.subplots(1, len(WEIGHTS), figsize=(13, 3.2),
                             gridspec_kw={"width_ratios": [1, 1, 1, 1, 1, 4]})
    for ax, short in zip(axes, WEIGHTS):
        name = f"layers.{block}.{short}.weight"
        (out_f, in_f), _ = layouts[0][name]
        owner = np.full((out_f, in_f), -1)
        for rank, lay in enumerate(layouts):
            kind, lo, hi = lay[name][1]
            if kind == "rows":
                owner[lo:hi, :] = rank
            else:
                owner[:, lo:hi] = rank
        assert (owner >= 0).all(), f"{name}: a part of the matrix has no owner"
        rgb = np.array(RANK_COLORS)[owner]
        ax.imshow(rgb, aspect="auto", interpolation="nearest")
        style = "column-parallel\n(rows split)" if layouts[0][name][1][0] == "rows" else "row-parallel\n(columns split)"
        ax.set_title(f"{short}\n{out_f}x{in_f}, {style}", fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_xlabel("in", fontsize=8)
        ax.set_ylabel("out", fontsize=8)
    handles = [plt.Rectangle((0, 0), 1, 1, color=RANK_COLORS[r]) for r in range(world)]
    fig.legend(handles, [f"rank {r}" for r in range(world)], loc="upper left",
               bbox_to_anchor=(1.0, 0.95), fontsize=8)
    replicated = sorted({n.split(".", 2)[-1] for n, (_, o) in layouts[0].items()
                         if o is None and n.startswith(f"layers.{block}.")})
    fig.suptitle(f"block {block} on {world} ranks; every rank also holds all of: "
                 f"{', '.join(replicated)}", fontsize=9)
    fig.tight_layout()
    return fig


def comm_rows(calls: list, layers: int) -> list:
    """Rows (operation, phase, where, count, KiB of tensors, KiB sent per rank) from a ledger's
    calls: per block, and the calls outside the blocks (embeddings, head, parameter gradients)."""
    rows = {}
    for c in calls:
        in_block = c["tag"].startswith("block")
        key = (c["op"], c["phase"], "per block" if in_block else "rest of the model")
        n, b, w = rows.get(key, (0, 0, 0))
        rows[key] = (n + 1, b + c["bytes"], w + c["wire"])
    out = []
    for (op, phase, where), (n, b, w) in sorted(rows.items(), key=lambda kv: (kv[0][2], kv[0][1] != "forward", kv[0][0])):
        div = layers if where == "per block" else 1
        out.append((op, phase, where, n / div, b / div / 1024, w / div / 1024))
    return out


def comm_figure(tables: dict, layers: int):
    """Collectives per block: count and KiB each rank sends (ring algorithms), forward and
    backward, for each design (``tables``: name -> ledger calls)."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    names = list(tables)
    ops = ("all_reduce", "all_gather", "reduce_scatter")
    colors = {"all_reduce": "tab:purple", "all_gather": "tab:green", "reduce_scatter": "tab:orange"}
    for ax, what in zip(axes, ("count", "KiB sent per rank")):
        x = 0
        ticks, labels = [], []
        for name in names:
            rows = [r for r in comm_rows(tables[name], layers) if r[2] == "per block"]
            for phase in ("forward", "backward"):
                bottom = 0.0
                for op in ops:
                    val = sum(r[3] if what == "count" else r[5] for r in rows if r[0] == op and r[1] == phase)
                    if val:
                        ax.bar(x, val, bottom=bottom, color=colors[op], label=op)
                        bottom += val
                ticks.append(x)
                labels.append(f"{name}\n{phase}")
                x += 1
            x += 0.5
        ax.set_xticks(ticks, labels, fontsize=8)
        ax.set_ylabel(f"{what} per block")
        handles, labs = ax.get_legend_handles_labels()
        uniq = dict(zip(labs, handles))
        ax.legend(uniq.values(), uniq.keys(), fontsize=8)
    fig.suptitle("collectives counted in one training step (inside the blocks)", fontsize=10)
    fig.tight_layout()
    return fig


def activation_figure(act: dict):
    """Saved-activation KiB per rank: dense, TP, TP + SP, split into LayerNorm regions, the
    column layers' inputs and the rest (``harness.saved_bytes``)."""
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    names = ("dense", "tp", "sp")
    labels = ("dense\n(1 process)", "TP", "TP + SP")
    bottom = np.zeros(len(names))
    for part, color, label in (("layernorm", "tab:red", "LayerNorm regions"),
                               ("linear_input", "tab:orange", "column layers' inputs"),
                               ("other", "tab:gray", "the rest")):
        kib = np.array([act[n][part] / 1024 for n in names])
        ax.bar(labels, kib, bottom=bottom, color=color, label=label)
        bottom += kib
    ax.set_ylabel("KiB saved for backward, per rank")
    ax.set_title(f"activations kept for backward ({act['world']} ranks)", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
