"""Figures of notebooks 00 and 01, drawn from real runs; each returns the figure and saves a PNG.

    fig = pingpong_figure(results, alpha, beta, "../images/00_pingpong.png")
"""
from __future__ import annotations


import matplotlib.pyplot as plt
import numpy as np

from source_code.basics.pingpong import crossover_bytes, model_time
from source_code.figures import export


def _save(fig, path):
    export(fig, path)  # images/ only when exporting on purpose (source_code/figures.py)
    return fig


def pingpong_figure(results: list[dict], alpha: float, beta: float, path=None):
    """Measured one-way time vs message size on log-log axes, with the alpha-beta model."""
    n = np.array([r["bytes"] for r in results], dtype=float)
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for r in results:  # every round trip, faint: the spread a busy machine adds
        ax.scatter([r["bytes"]] * len(r["rtt_s"]), np.array(r["rtt_s"]) / 2 * 1e6, s=6,
                   color="0.75", zorder=1)
    ax.plot(n, [r["one_way_s"] * 1e6 for r in results], "o", label="measured (fastest round trip / 2)",
            zorder=3)
    grid = np.geomspace(n.min(), n.max(), 200)
    ax.plot(grid, model_time(grid, alpha, beta) * 1e6, "-",
            label=f"model: {alpha * 1e6:.0f} us + n / {beta / 1e9:.2f} GB/s", zorder=2)
    ax.axhline(alpha * 1e6, ls=":", color="0.4", label="latency alpha")
    ax.axvline(crossover_bytes(alpha, beta), ls="--", color="0.4", label="n = alpha x beta")
    ax.set(xscale="log", yscale="log", xlabel="message size n (bytes)",
           ylabel="one-way time (us)", title="Ping-pong between two processes")
    ax.legend(fontsize=8)
    return _save(fig, path)


def sgd_figure(runs: dict, path=None, time_runs: dict | None = None):
    """Full training loss against epochs, against updates, and (with ``time_runs``, the runs
    to plot against time) against seconds of update time."""
    panels = 3 if time_runs else 2
    fig, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 4))
    a, b = axes[0], axes[1]
    for name, h in runs.items():
        a.plot(h["epochs"], h["loss"], label=name)
        b.plot(h["updates"], h["loss"], label=name)
    a.set(xlabel="epochs (passes over the data)", ylabel="training loss", yscale="log",
          title="Same compute: loss per epoch")
    b.set(xlabel="updates (one gradient evaluation each)", xscale="symlog", yscale="log",
          title="Same number of updates")
    if time_runs:
        for name, h in time_runs.items():
            axes[2].plot(1e3 * np.array(h["seconds"]), h["loss"], label=name)
        axes[2].set(xlabel="milliseconds of updates (this machine)", xscale="symlog", yscale="log",
                    title="Same time")
        axes[2].legend(fontsize=8)
    a.legend(fontsize=8)
    b.legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, path)


def _run_color(name: str) -> str:
    """The same colour for the same kind of run in every panel."""
    for key, color in (("warmup", "C3"), ("unscaled", "C1"), ("scaled", "C2")):
        if key in name:
            return color
    return "C0"


def lr_scaling_figure(runs: dict, runs_larger: dict | None = None, path=None):
    """Loss against epochs for the linear-scaling runs; on the right, the runs of a larger k."""
    panels = [(runs, "Linear scaling rule")]
    if runs_larger:
        panels.append((runs_larger, "A larger k"))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for ax, (group, title) in zip(axes[0], panels):
        for name, h in group.items():
            ax.plot(h["epochs"], h["loss"], label=name, color=_run_color(name))
        ax.axhline(group[next(iter(group))]["loss"][0], ls=":", color="0.4", label="loss at start")
        ax.set(xlabel="epochs", ylabel="training loss", yscale="log", title=title)
        ax.legend(fontsize=8)
    return _save(fig, path)
