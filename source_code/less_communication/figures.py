"""Notebook 18's figures: loss against steps and against simulated time on a link; the H sweep."""
from __future__ import annotations

import matplotlib.pyplot as plt

from source_code.figures import export
from source_code.less_communication.harness import replay_time


def curves(runs: dict, methods, link: str, name: str | None = None, compute_s: float | None = None):
    """Two panels with the same loss axis: held-out loss against steps, and against the
    simulated seconds on ``link`` (``compute_s`` a step, else each run's own median, plus its
    collectives on that link)."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
    for m in methods:
        steps, loss = zip(*runs[m]["evals"])
        times = replay_time(runs[m], link, compute_s)
        line, = a.plot(steps, loss, "o-", ms=3, label=m)
        b.plot([times[k - 1] for k in steps], loss, "o-", ms=3, color=line.get_color(), label=m)
    a.set_xlabel("step")
    a.set_ylabel("held-out loss")
    b.set_xlabel(f"simulated seconds on the {link} link")
    b.set_xscale("log")
    for ax in (a, b):
        ax.grid(alpha=0.3)
    b.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    fig.tight_layout()
    export(fig, name)
    return fig


def sweep(hs, losses, ddp_loss: float, bytes_ratio, name: str | None = None):
    """DiLoCo's held-out loss against H (log x), DDP's as a line; bytes per step on the right."""
    fig, a = plt.subplots(figsize=(6.5, 3.6))
    a.plot(hs, losses, "o-", label="DiLoCo held-out loss")
    a.axhline(ddp_loss, color="k", ls="--", label="DDP held-out loss")
    a.set_xscale("log", base=2)
    a.set_xticks(hs, [str(h) for h in hs])
    a.set_xlabel("H (inner steps between synchronisations)")
    a.set_ylabel("held-out loss")
    r = a.twinx()
    r.plot(hs, bytes_ratio, "s:", color="tab:red", label="bytes per step / DDP's")
    r.set_yscale("log")
    r.set_ylabel("bytes per step / DDP's")
    handles = a.get_legend_handles_labels()[0] + r.get_legend_handles_labels()[0]
    fig.legend(handles, [h.get_label() for h in handles], loc="upper center",
               bbox_to_anchor=(0.5, 0.0), ncol=3, fontsize=8)
    fig.tight_layout()
    export(fig, name)
    return fig
