"""Figures of notebook 19, drawn from the matrix run (matrix.run).

    fig = uneven_figure(result["uneven"])        # naive vs fixed gradients, every uneven case
    fig = matrix_figure(result)                  # loss curves; differences in fp32 and in fp64
    save_figure(fig, "19_matrix.png")            # images/ only when WORKSHOP_EXPORT_FIGURES=1
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from source_code.figures import export as save_figure  # noqa: F401

CASES = {"ddp": "DDP, 2 ranks", "accumulation": "accumulation, 2 microbatches",
         "dp_accumulation": "DDP 2 ranks x 2 microbatches", "cp": "ring CP, 2 ranks (zigzag)",
         "torch_pipeline": "torch ScheduleGPipe, scale_grads"}
GOALS = {"fp32": 1e-5, "fp64": 1e-12}


def uneven_figure(uneven: dict, curves: dict | None = None, goal_fixed: float = 1e-6,
                  goal_naive: float = 1e-3):
    """Max |gradient - one process| per case: mean of piece means vs the global-count fix; with
    ``curves`` (matrix.run's "curves"), beside it |loss - one process| per step of DDP training."""
    cases = [k for k in CASES if k in uneven]
    if curves:
        fig, (ax, over) = plt.subplots(1, 2, figsize=(13, 3.8), gridspec_kw={"width_ratios": [1.6, 1]})
    else:
        fig, ax = plt.subplots(figsize=(8.5, 3.6))
    y = np.arange(len(cases))
    ax.barh(y + 0.2, [uneven[k]["naive"] for k in cases], height=0.38, color="tab:red",
            label="mean of per-piece means")
    ax.barh(y - 0.2, [uneven[k]["fixed"] for k in cases], height=0.38, color="tab:green",
            label="sum / global token count")
    ax.axvline(goal_naive, color="tab:red", linestyle=":", label=f"{goal_naive:g}: visibly wrong above")
    ax.axvline(goal_fixed, color="tab:green", linestyle=":", label=f"{goal_fixed:g}: goal of the fix (fp32)")
    ax.set_xscale("log")
    ax.set_xlim(1e-10, 10)
    ax.set_yticks(y, [CASES[k] for k in cases], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("max |gradient - one-process gradient|")
    ax.set_title(f"uneven tokens: samples with {', '.join(map(str, uneven['counts']))} valid targets "
                 f"(CP: {', '.join(map(str, uneven['equal']))})", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    if curves:
        ref = np.array(curves["one process"])
        steps = np.arange(1, len(ref) + 1)
        floor = 1e-18                   # an equal loss (the first step's is forward-only): the bottom
        for key, colour in (("naive", "tab:red"), ("fixed", "tab:green")):
            over.plot(steps, np.maximum(np.abs(np.array(curves[key]) - ref), floor), color=colour,
                      marker="o", markersize=3, label=f"DDP, {'mean of means' if key == 'naive' else 'sum / global count'}")
        over.set_yscale("log")
        over.set_ylim(floor, 1)
        over.set_xticks(steps)
        over.set_xlabel("step (fp64, DDP on 2 ranks)")
        over.set_ylabel("|loss - one process| (0: bottom)")
        over.legend(fontsize=7, loc="center right")
        over.set_title("over training, on the matrix's batches", fontsize=10)
    fig.tight_layout()
    return fig


def matrix_figure(result: dict):
    """Left: loss per step of one process, of every configuration, and of the handed DP x CP
    step. Right: each configuration's largest loss difference from one process, fp32 and fp64,
    against its goal (the legend below the axes, where it hides no bar or line)."""
    rows = result["rows"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 6.4), gridspec_kw={"width_ratios": [1, 1.3]})
    ref = result["reference"]["fp32"]
    steps = np.arange(1, len(ref["dense"]) + 1)
    for i, r in enumerate(rows):
        left.plot(steps, r["fp32"]["losses"], color="tab:blue", alpha=0.4, linewidth=1,
                  label=(f"{sum(r['family'] != 'control' for r in rows)} configurations + "
                         f"{sum(r['family'] == 'control' for r in rows)} controls") if i == 0 else None)
    left.plot(steps, ref["dense"], color="black", linestyle="--", marker="o", markersize=4,
              label="one process (dense)")
    left.plot(steps, ref["moe"], color="gray", linestyle=":", marker="s", markersize=4,
              label="one process (MoE, for EP)")
    if "seeded_bug" in result:
        left.plot(steps, result["seeded_bug"]["losses"], color="tab:red", marker="x",
                  label="DP x CP as handed over")
    left.set_xlabel("step (fp32)")
    left.set_ylabel("loss (per valid token)")
    left.set_xticks(steps)
    left.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2)
    left.set_title("loss curves: the configurations lie on one process's", fontsize=10)
    y = np.arange(len(rows))
    floor = 1e-18                       # a difference of exactly 0: off the axis, labelled
    for dtype, dy, colour in (("fp32", 0.2, "tab:blue"), ("fp64", -0.2, "tab:purple")):
        have = [i for i, r in enumerate(rows) if dtype in r]
        right.barh(y[have] + dy, [max(rows[i][dtype]["loss_diff"], floor) for i in have], height=0.38,
                   color=colour, label=f"max |loss diff|, {dtype} ({result['steps'][dtype]} steps)")
        right.axvline(GOALS[dtype], color=colour, linestyle=":", label=f"{GOALS[dtype]:g} goal ({dtype})")
        for i in have:
            if rows[i][dtype]["loss_diff"] == 0:      # no bar on a log axis: say it
                right.text(2e-17, y[i] + dy, f"0 ({dtype}: equal)", va="center", fontsize=7, color=colour)
    right.set_xscale("log")
    right.set_xlim(1e-17, 1e-3)
    right.set_yticks(y, [r["name"] for r in rows], fontsize=8)
    right.invert_yaxis()
    right.set_xlabel("difference from one process on the whole batch")
    right.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2)
    right.set_title("every configuration against one process", fontsize=10)
    fig.tight_layout()
    return fig
