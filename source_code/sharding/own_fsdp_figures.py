"""Figures of notebook 09's FSDP-by-hand section, drawn from own_fsdp_report's counts and stamps."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

LABELS = {"ddp": "DDP", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "own_fsdp": "FSDP by hand",
          "fully_shard": "fully_shard"}


def bytes_figure(res: dict):
    """Per-rank bytes of each implementation: resident between units, what block 0's forward
    gathers on top (the forward peak), and beside it the backward peak where it is counted."""
    impls = [k for k in LABELS if k in res["bytes"]]
    b, kib = res["bytes"], 2 ** 10
    x = np.arange(len(impls))
    fig, ax = plt.subplots(figsize=(8, 3.4))
    resident = np.array([b[k]["resident"] / kib for k in impls])
    gathered = np.array([b[k]["gathered"] / kib for k in impls])
    counted = [i for i, k in enumerate(impls) if "backward_peak" in b[k]]
    backward = np.array([b[impls[i]]["backward_peak"] / kib for i in counted])
    ax.bar(x - 0.2, resident, 0.38, color="tab:blue", label="resident between units")
    ax.bar(x - 0.2, gathered, 0.38, bottom=resident, color="tab:orange",
           label="gathered while block 0 computes (forward peak = top)")
    ax.bar(x[counted] + 0.2, backward, 0.38, color="tab:green", label="backward peak (counted)")
    prefetch = res.get("timeline", {}).get("overlapped", {}).get("backward_peak")
    plain = b.get("own_fsdp", {}).get("backward_peak")
    if prefetch is not None and "own_fsdp" in impls and prefetch != plain:   # a second unit full at once
        ax.bar(x[impls.index("own_fsdp")] + 0.2, prefetch / kib, 0.38, fill=False, hatch="//",
               edgecolor="tab:green", label="backward peak with prefetch")
        backward = np.append(backward, prefetch / kib)
    for i in sorted(set(range(len(impls))) - set(counted)):
        ax.text(x[i] + 0.2, 0.02 * max(backward), "not\ncounted", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(x, [LABELS[k] for k in impls])
    ax.set_ylabel("KiB per rank (counted tensors)")
    ax.set_ylim(0, max(max(resident + gathered), max(backward)) * 1.35)
    ax.set_title(f"Training state per rank, N = {res['world_size']}, {res['device']}")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    return fig


def timeline_figure(tl: dict):
    """One step, serial and overlapped: per unit, its transfers in flight (issue to arrival:
    all-gathers, reduce-scatters) and its computation, forward and backward, from measured
    timestamps; both panels on one time axis."""
    fig, axes = plt.subplots(2, 1, figsize=(9, 4.6), sharex=True)
    colors = {"gather": "tab:orange", "reduce": "tab:green", "compute": "tab:blue", "all_reduce": "tab:gray"}
    names = {"gather": "all-gather in flight", "reduce": "reduce-scatter in flight", "compute": "unit computes",
             "all_reduce": "LayerNorm all-reduce (blocks; not computation)"}
    for ax, key in zip(axes, ("serial", "overlapped")):
        run, seen = tl[key], set()
        units = list(run["intervals"])
        for row, u in enumerate(units):
            for phase in ("forward", "backward"):
                for kind, span in run["intervals"][u].get(phase, {}).items():
                    if kind == "wait":                   # a moment, not an interval
                        continue
                    a, b = span
                    y = row - 0.18 if kind == "compute" else row + 0.18
                    ax.barh(y, 1e3 * (b - a), 0.34, left=1e3 * a, color=colors[kind],
                            label=None if kind in seen else names[kind])
                    seen.add(kind)
        for a, b in run.get("all_reduces", ()):        # a row of their own, below the units
            ax.barh(len(units), 1e3 * (b - a), 0.34, left=1e3 * a, color=colors["all_reduce"],
                    label=None if "all_reduce" in seen else names["all_reduce"])
            seen.add("all_reduce")
        units = units + (["norm all-reduces"] if run.get("all_reduces") else [])
        ax.set_yticks(range(len(units)), units)
        ax.invert_yaxis()
        h = run["hidden"]
        ax.set_title(f"{key}: forward {run['forward_ms']:.1f} ms, backward {run['backward_ms']:.1f} ms; "
                     f"under computation {h['forward']:.0%} of the forward's all-gather time, "
                     f"{h['backward']:.0%} of the backward's transfers", fontsize=9)
    axes[-1].set_xlabel("ms since the step started (rank 0)")
    handles, labels = axes[1].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=4, fontsize=8, bbox_to_anchor=(0.5, 1.0))
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    return fig
