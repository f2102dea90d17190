"""Figures of notebook 09's FSDP-by-hand section, drawn from own_fsdp_report's counted bytes."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

LABELS = {"ddp": "DDP", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "own_fsdp": "FSDP by hand",
          "fully_shard": "fully_shard"}


def bytes_figure(res: dict):
    """Per-rank bytes of each implementation: resident between units (params + grads +
    optimizer state), and on top what one block's forward gathers (the peak)."""
    impls = [k for k in LABELS if k in res["bytes"]]
    b = res["bytes"]
    kib = 2 ** 10
    x = np.arange(len(impls))
    fig, ax = plt.subplots(figsize=(8, 3.4))
    resident = [b[k]["resident"] / kib for k in impls]
    gathered = [b[k]["gathered"] / kib for k in impls]
    ax.bar(x, resident, 0.6, color="tab:blue", label="resident between units")
    ax.bar(x, gathered, 0.6, bottom=resident, color="tab:orange",
           label="gathered while block 0 computes (peak = top)")
    ax.set_xticks(x, [LABELS[k] for k in impls])
    ax.set_ylabel("KiB per rank (counted tensors)")
    ax.set_ylim(0, max(r + g for r, g in zip(resident, gathered)) * 1.3)
    ax.set_title(f"Training state per rank, N = {res['world_size']}, {res['device']}")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    return fig


def timeline_figure(pf: dict):
    """One forward without and with prefetch: per unit, its all-gather in flight (issue to
    arrival) and its computation, from measured timestamps; both panels on one time axis."""
    fig, axes = plt.subplots(2, 1, figsize=(9, 4.2), sharex=True)
    for ax, key, title in zip(axes, ("none", "prefetch"), ("no prefetch", "prefetch")):
        iv = pf[key]["intervals"]
        names = list(iv)
        for row, u in enumerate(names):
            (a, b), (c, d) = iv[u]["transfer"], iv[u]["compute"]
            ax.barh(row + 0.18, 1e3 * (b - a), 0.34, left=1e3 * a, color="tab:orange",
                    label="all-gather in flight" if row == 0 else None)
            ax.barh(row - 0.18, 1e3 * (d - c), 0.34, left=1e3 * c, color="tab:blue",
                    label="unit computes" if row == 0 else None)
        ax.set_yticks(range(len(names)), names)
        ax.invert_yaxis()
        ax.set_title(f"{title}: forward {pf[key]['forward_ms']:.1f} ms, "
                     f"{pf[key]['hidden_fraction']:.0%} of transfer time under computation", fontsize=9)
    axes[-1].set_xlabel("ms since the forward started (rank 0)")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="upper center", ncol=2, fontsize=8,
               bbox_to_anchor=(0.5, 1.0))        # above the panels, never over a bar
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    return fig
