"""Notebook 20's figures, drawn from the runs' numbers (report.py's results)."""
from __future__ import annotations

import matplotlib.pyplot as plt

from source_code.data_at_scale.shuffling import ORDERS


def layouts_figure(rows: list[dict]):
    """Requests per epoch, and the epoch's seconds on the local disk and on Lustre (modelled)."""
    names = [r["layout"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.4))
    left.bar(names, [r["requests"] for r in rows], color="tab:blue")
    left.set_yscale("log")
    left.set_ylabel("file-system requests per epoch")
    left.set_title("What one epoch asks of the file system")
    for i, r in enumerate(rows):
        left.text(i, r["requests"], str(r["requests"]), ha="center", va="bottom")
    x = range(len(rows))
    right.bar([i - 0.27 for i in x], [r["cpu_s"] for r in rows], 0.27, label="CPU time of the reading (this machine)")
    right.bar(list(x), [r["wait_s"] for r in rows], 0.27, label="waiting for Lustre (modelled from the counts)")
    right.bar([i + 0.27 for i in x], [r["lustre_s"] for r in rows], 0.27, label="both: the epoch on Lustre")
    right.set_xticks(list(x), names)
    right.set_ylabel("seconds per epoch")
    right.set_title("One reader's epoch")
    right.legend(fontsize=8, loc="upper right")   # the loose files, tallest, stand on the left
    fig.tight_layout()
    return fig


def steps_figure(uneven: list[dict], joined: list[dict], padded: list[dict]):
    """Steps per rank: whole shards per rank (hang), the same under Join, split by sample and padded."""
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ranks = sorted(r["rank"] for r in uneven)
    width = 0.27
    for k, (label, reports, key) in enumerate([("by shard: its batches (hangs after the shortest)", uneven, "batches"),
                                               ("by shard under Join: steps taken", joined, "steps"),
                                               ("by sample, padded: steps taken", padded, "steps")]):
        by_rank = {r["rank"]: r[key] for r in reports}
        ax.bar([r + (k - 1) * width for r in ranks], [by_rank[r] for r in ranks], width, label=label)
    ax.set_xticks(ranks, [f"rank {r}" for r in ranks])
    ax.set_ylabel("steps in the epoch")
    ax.legend(fontsize=8, loc="lower left")
    ax.set_title("Ten shards over four ranks")
    fig.tight_layout()
    return fig


def shuffle_figure(results: list[dict], random_pairs: float):
    """Held-out loss against steps for each order (every seed), and the same-shard statistic."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.4), gridspec_kw={"width_ratios": [2, 1]})
    colors = dict(zip(ORDERS, ["tab:red", "tab:orange", "tab:green"]))
    for seed, result in enumerate(results):
        for kind in ORDERS:
            steps, losses = zip(*result[kind]["curve"])
            left.plot(steps, losses, color=colors[kind], alpha=0.8, label=kind if seed == 0 else None,
                      linestyle="-" if seed == 0 else "--")
    left.set_xlabel("step (one epoch)")
    left.set_ylabel("held-out loss")
    left.set_title("The sort task, the same weights, three orders (dashed: 2nd seed)")
    left.legend()
    means = [sum(r[kind]["pairs"] for r in results) / len(results) / random_pairs for kind in ORDERS]
    right.bar(range(len(ORDERS)), means, color=[colors[k] for k in ORDERS])
    right.axhline(1, color="k", lw=0.8)
    right.set_xticks(range(len(ORDERS)), [k.replace(" + ", "\n+ ") for k in ORDERS])
    right.set_ylabel("same-shard pairs in a batch / random")
    right.set_title("How far from random")
    fig.tight_layout()
    return fig
