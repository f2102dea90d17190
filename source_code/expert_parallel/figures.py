"""Figures of notebook 14, drawn from the runs' results.

    fig = collectives_figure(bench_result)        # bench.report(): time vs size, skewed dispatch
    fig = tokens_figure(study)                    # train.balance_study(): tokens per expert
    save_figure(fig, "14_collectives.png")        # images/ only when WORKSHOP_EXPORT_FIGURES=1
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from source_code.costmodel import model_time
from source_code.figures import export as save_figure  # noqa: F401  (images/ only when exporting)

COLORS = {"all_to_all": "tab:red", "all_gather": "tab:blue", "all_reduce": "tab:green"}


def collectives_figure(result: dict):
    """Left: median time of each collective vs buffer size, measured (dots) and its alpha-beta
    fit (line). Right: bytes each rank receives in the dispatch for routers of growing skew."""
    coll, skew = result["collectives"], result["skew"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 3.6))
    sizes = np.array(coll["sizes"], dtype=float)
    for op, median in coll["median"].items():
        alpha, beta = coll["fits"][op]
        ax.loglog(sizes, [1e3 * median[s] for s in coll["sizes"]], "o", color=COLORS[op], label=op)
        ax.loglog(sizes, 1e3 * model_time(sizes, alpha, beta), "-", color=COLORS[op], alpha=0.6)
    ax.set_xlabel("buffer per rank (bytes)")
    ax.set_ylabel("ms (median, slowest rank)")
    ax.set_title(f"{coll['world']} ranks: measured (dots), alpha-beta fit (lines)", fontsize=9)
    ax.legend(fontsize=8)
    n = len(skew[0]["received"])
    width = 0.8 / n
    for r in range(n):
        got = [row["received"][r] / 2**20 for row in skew]
        bx.bar(np.arange(len(skew)) + (r - (n - 1) / 2) * width, got, width, label=f"rank {r}")
    bx.set_xticks(range(len(skew)),
                  [f"{label(row['bias'])}\n{1e3 * row['seconds']:.1f} ms" for row in skew])
    bx.set_ylabel("MiB received from other ranks")
    bx.set_title("dispatch all-to-all, router biased towards expert 0 (on rank 0)", fontsize=9)
    bx.legend(fontsize=8)
    fig.tight_layout()
    return fig


def label(bias) -> str:
    """How a router of bench.skew is named in tables and figures."""
    return "even split" if bias is None else f"bias {bias:g}"


def tokens_figure(study: dict):
    """Held-out tokens per expert, every layer, without and with the balancing loss; the
    dashed line is the mean (a perfectly even router)."""
    layers = len(study["without"]["per_expert"])
    fig, axes = plt.subplots(1, layers, figsize=(5 * layers, 3.2), sharey=True, squeeze=False)
    for i, ax in enumerate(axes[0]):
        e = np.arange(len(study["without"]["per_expert"][i]))
        for shift, name, color in ((-0.2, "without", "tab:gray"), (0.2, "with", "tab:orange")):
            tokens = study[name]["per_expert"][i]
            ax.bar(e + shift, tokens, 0.4, color=color, label=f"{name} balancing loss")
        ax.axhline(np.mean(study["without"]["per_expert"][i]), ls="--", color="k", lw=0.8)
        ep = study["without"]["ep"]
        for boundary in range(1, ep):
            ax.axvline(boundary * len(e) / ep - 0.5, color="k", lw=0.5)
        ax.set_xticks(e)
        ax.set_xlabel(f"expert (vertical line: rank boundary, {ep} ranks)")
        ax.set_title(f"layer {i}", fontsize=9)
    axes[0][0].set_ylabel("assignments (held-out batch)")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
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
    ax.set_title(f"top-{r.expert.shape[1]} routing, capacity {capacity} per expert: "
                 "circles kept (1st / 2nd choice), red crosses dropped", fontsize=9)
    fig.colorbar(im, ax=ax, label="router probability", fraction=0.03)
    fig.tight_layout()
    return fig
