"""Notebook 18's figures: loss against steps and simulated time, error feedback per seed, the H
sweep, and time to a target against the link's bandwidth."""
from __future__ import annotations

import matplotlib.pyplot as plt

from source_code.figures import export
from source_code.less_communication import links, payoff
from source_code.less_communication.harness import replay_time

BASELINES = ("ddp", "ddp-sgd")


def curves(runs: dict, methods, link: str, name: str | None = None, compute_s: float | None = None):
    """Two panels with the same loss axis: held-out loss against steps, and against the
    simulated seconds on ``link`` (``compute_s`` a step, plus its collectives on that link).
    The baselines are drawn wide and pale under the others, so a method that follows its
    baseline step for step (fp16) shows as a line on top of it, not instead of it."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
    for m in methods:
        steps, loss = zip(*runs[m]["evals"])
        times = [0.0] + replay_time(runs[m], link, compute_s)
        first = runs[m]["first"]
        style = dict(lw=5, alpha=0.35, zorder=1) if m in BASELINES else dict(lw=1.4, ms=3, marker="o", zorder=2)
        line, = a.plot(steps, loss, label=m, **style)
        b.plot([times[k - first] for k in steps], loss, color=line.get_color(), **style)
    a.set_xlabel("step (the common start at the first point)")
    a.set_ylabel("held-out loss")
    b.set_xlabel(f"simulated seconds on the {link} link after the start")
    b.set_xscale("symlog", linthresh=0.1)
    for ax in (a, b):
        ax.grid(alpha=0.3)
    a.legend(loc="upper right", fontsize=8, ncol=2)
    fig.tight_layout()
    export(fig, name)
    return fig


def ef_spread(gaps: dict, name: str | None = None, tolerance: float | None = None):
    """``gaps[(rank, with_ef)] = [gap per seed]``: PowerSGD's held-out loss above DDP's with the
    same optimizer, per seed, with and without error feedback (a key left out is not drawn; a
    mean bar only over several seeds, each rank's seed count under it);
    ``tolerance`` (a fraction) shades the band called tracking DDP."""
    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    if tolerance is not None:
        ax.axhspan(-100 * tolerance, 100 * tolerance, color="0.85", zorder=0,
                   label=f"within {100 * tolerance:g} % of DDP")
    ranks = sorted({r for r, _ in gaps})
    labelled = set()
    for i, r in enumerate(ranks):
        for j, (ef, color) in enumerate(((True, "tab:blue"), (False, "tab:orange"))):
            if (r, ef) not in gaps:                  # a rank run one way only
                continue
            ys = [100 * g for g in gaps[(r, ef)]]
            x = i + (j - 0.5) * 0.3
            ax.scatter([x] * len(ys), ys, color=color, zorder=2,
                       label=None if ef in labelled else ("with" if ef else "without") + " error feedback")
            labelled.add(ef)
            if len(ys) > 1:                         # a mean only where there are seeds to average
                ax.plot([x - 0.1, x + 0.1], [sum(ys) / len(ys)] * 2, color=color, lw=2)
    ax.axhline(0, color="k", lw=0.8)
    seeds = {r: max(len(v) for (rr, _), v in gaps.items() if rr == r) for r in ranks}
    ax.set_xticks(range(len(ranks)), [f"rank {r}\n({seeds[r]} seed{'s' if seeds[r] > 1 else ''})" for r in ranks])
    ax.set_ylabel("held-out loss above DDP's (%)")
    ax.legend(fontsize=8, loc="upper right")
    ax.grid(axis="y", alpha=0.3)
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


def bandwidth(pairs: list, alpha: float, compute_s: float, betas, name: str | None = None):
    """Time to the target against the link's bandwidth (latency ``alpha``): a panel per pair
    {DDP with one optimizer: its terms, its contender: its terms} (``payoff.terms``), each pair
    with its own target, so no line of one panel compares with another's; a crossover is where
    a panel's two lines meet."""
    fig, axes = plt.subplots(1, len(pairs), figsize=(5.5 * len(pairs), 3.6), squeeze=False)
    for ax, pair in zip(axes[0], pairs):
        for m, t in pair.items():
            times = [payoff.seconds(t, links.Link("swept", alpha, b, ""), compute_s) for b in betas]
            ax.plot([b * 8 / 1e9 for b in betas], times, label=m)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"link bandwidth (Gb/s), latency {alpha * 1e3:g} ms")
        ax.set_ylabel("seconds to the target")
        first, *rest = pair
        ax.set_title(f"{first} against " + " and ".join(rest), fontsize=9)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.tight_layout()
    export(fig, name)
    return fig
