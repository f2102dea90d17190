"""Figures of notebook 14, drawn from the runs' results.

    fig = collectives_figure(bench_result)        # bench.report(): time vs size, skewed dispatch
    fig = tokens_figure(study)                    # train.balance_study(): tokens per expert
    save_figure(fig, "14_collectives.png")        # images/ only when WORKSHOP_EXPORT_FIGURES=1
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.lines import Line2D

from source_code.costmodel import model_time
from source_code.figures import export as save_figure  # noqa: F401  (images/ only when exporting)

COLORS = {"all_to_all": "tab:red", "all_gather": "tab:blue", "all_reduce": "tab:green"}


def collectives_figure(result: dict):
    """Left: median time of each collective vs buffer size, measured (dots) and its alpha-beta
    fit (line). Right: bytes each rank receives in the dispatch for routers of growing skew."""
    coll, skew = result["collectives"], result["skew"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.2))
    sizes = np.array(coll["sizes"], dtype=float)
    for op, median in coll["median"].items():
        alpha, beta = coll["fits"][op]
        ax.loglog(sizes, [1e3 * median[s] for s in coll["sizes"]], "o", color=COLORS[op],
                  label=f"{op}, measured")
        ax.loglog(sizes, 1e3 * model_time(sizes, alpha, beta), "-", color=COLORS[op], alpha=0.6,
                  label=f"{op}, alpha-beta fit")
    ax.set_xlabel("buffer per rank (bytes)")
    ax.set_ylabel("ms (median, slowest rank)")
    ax.set_title(f"{coll['world']} ranks: three collectives of the same buffer size", fontsize=9)
    ax.legend(fontsize=7, ncol=3, loc="lower center", bbox_to_anchor=(0.5, 1.08), frameon=False)
    n = len(skew[0]["received"])
    width = 0.8 / n
    for r in range(n):
        got = [row["received"][r] / 2**20 for row in skew]
        bx.bar(np.arange(len(skew)) + (r - (n - 1) / 2) * width, got, width, label=f"rank {r} receives")
    even = skew[0]["received"][0] / 2**20
    bx.axhline(even, ls="--", color="k", lw=0.8, label="even router's share")
    bx.set_xticks(range(len(skew)),
                  [f"{label(row['bias'])}\n{1e3 * row['seconds']:.1f} ms" for row in skew])
    bx.set_ylabel("MiB received from other ranks")
    bx.set_xlabel("router (logit of expert 0, on rank 0, raised by the bias); all-to-all time")
    bx.set_title("the dispatch all-to-all under a skewed router", fontsize=9)
    bx.legend(fontsize=7, ncol=3, loc="lower center", bbox_to_anchor=(0.5, 1.08), frameon=False)
    fig.tight_layout()
    return fig


def label(bias) -> str:
    """How a router of bench.skew is named in tables and figures."""
    return "even split" if bias is None else f"bias {bias:g}"


def tokens_figure(study: dict):
    """Held-out tokens per expert, every layer, without and with the balancing loss; the
    dashed line is the mean (a perfectly even router)."""
    layers = len(study["without"]["per_expert"])
    fig, axes = plt.subplots(1, layers, figsize=(5 * layers, 3.6), sharey=True, squeeze=False)
    for i, ax in enumerate(axes[0]):
        e = np.arange(len(study["without"]["per_expert"][i]))
        for shift, name, color in ((-0.2, "without", "tab:gray"), (0.2, "with", "tab:orange")):
            tokens = study[name]["per_expert"][i]
            ax.bar(e + shift, tokens, 0.4, color=color, label=f"{name} balancing loss")
        ax.axhline(np.mean(study["without"]["per_expert"][i]), ls="--", color="k", lw=0.8,
                   label="mean: a perfectly even router")
        ep = study["without"]["ep"]
        for boundary in range(1, ep):
            ax.axvline(boundary * len(e) / ep - 0.5, color="k", lw=0.5,
                       label=f"rank boundary ({ep} ranks)" if boundary == 1 else None)
        ax.set_xticks(e)
        ax.set_xlabel("expert")
        ax.set_title(f"layer {i}", fontsize=9)
    axes[0][0].set_ylabel("assignments (held-out batch)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, ncol=len(labels), loc="upper center", frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    return fig


def routing_figure(r, capacity: int):
    """One routing decision (router.Routing): the router's probabilities, tokens across and
    experts down; a circle for each kept choice (the number is 1 or 2: first or second choice),
    a red cross for each choice over capacity."""
    probs = r.probs.detach().numpy().T                              # (E, N)
    fig, ax = plt.subplots(figsize=(8, 2.6))
    im = ax.imshow(probs, cmap="Blues", aspect="auto", vmin=0)
    for t in range(r.expert.shape[0]):
        for j in range(r.expert.shape[1]):
            e = int(r.expert[t, j])
            if r.keep[t, j]:
                ax.text(t, e, str(j + 1), ha="center", va="center", fontsize=8,
                        bbox={"boxstyle": "circle", "fc": "white", "ec": "k", "lw": 0.6})
            else:
                ax.plot(t, e, "x", color="red", ms=10, mew=2)
    ax.set_xticks(range(probs.shape[1]))
    ax.set_yticks(range(probs.shape[0]))
    ax.set_xlabel("token")
    ax.set_ylabel("expert")
    ax.set_title(f"top-{r.expert.shape[1]} routing, capacity {capacity} per expert", fontsize=9)
    keys = [Line2D([], [], ls="", marker="o", mfc="white", mec="k", ms=9,
                   label="kept choice (the number: 1st or 2nd)"),
            Line2D([], [], ls="", marker="x", color="red", ms=9, mew=2, label="over capacity: dropped")]
    ax.legend(handles=keys, fontsize=8, ncol=2, loc="lower center", bbox_to_anchor=(0.5, 1.1), frameon=False)
    fig.colorbar(im, ax=ax, label="router probability", fraction=0.03)
    fig.tight_layout()
    return fig


def receive_figure(received: dict, bound: int, even: float, row_bytes: int):
    """Rows each rank received in the skewed dispatch, dropless and with a capacity (one bar
    each per rank), beside the capacity's bound and the even router's share."""
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    ranks = np.arange(len(next(iter(received.values()))))
    for shift, (name, rows), color in zip((-0.2, 0.2), received.items(), ("tab:red", "tab:blue")):
        ax.bar(ranks + shift, rows, 0.4, color=color, label=name)
    ax.axhline(bound, color="tab:blue", ls="--", lw=1, label="capacity bound: n x C x E/n rows")
    ax.axhline(even, color="k", ls=":", lw=1, label="even router's share")
    ax.set_xticks(ranks)
    ax.set_xlabel("receiving rank (expert 0, the favourite, lives on rank 0)")
    ax.set_ylabel(f"rows received ({row_bytes} B each)")
    ax.set_ylim(0, 1.45 * max(max(max(r) for r in received.values()), bound))
    ax.legend(fontsize=8, loc="upper right", ncol=2, frameon=False)
    ax.set_title("dispatch receive buffer per rank, router skewed towards expert 0", fontsize=9)
    fig.tight_layout()
    return fig
