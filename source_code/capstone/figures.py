"""Figures of notebook 19, drawn from the matrix run (matrix.run).

    fig = uneven_figure(result["uneven"])        # naive vs fixed gradients, 3 cases
    fig = matrix_figure(result)                  # loss curves and the table of differences
    save_figure(fig, "19_matrix.png")            # images/ only when WORKSHOP_EXPORT_FIGURES=1
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from source_code.figures import export as save_figure  # noqa: F401

CASES = (("ddp", "DDP, 2 ranks"), ("accumulation", "accumulation, 2 microbatches"),
         ("pipeline", "GPipe, 2 stages x 2 microbatches"))


def uneven_figure(uneven: dict, goal_fixed: float = 1e-6, goal_naive: float = 1e-3):
    """Max |gradient - one process| per case: mean of piece means vs the global-count fix."""
    fig, ax = plt.subplots(figsize=(7.5, 3.2))
    y = np.arange(len(CASES))
    naive = [uneven[k]["naive"] for k, _ in CASES]
    fixed = [uneven[k]["fixed"] for k, _ in CASES]
    ax.barh(y + 0.2, naive, height=0.38, color="tab:red", label="mean of per-piece means")
    ax.barh(y - 0.2, fixed, height=0.38, color="tab:green", label="sum / global token count")
    ax.axvline(goal_naive, color="tab:red", linestyle=":", label=f"{goal_naive:g}: visibly wrong above")
    ax.axvline(goal_fixed, color="tab:green", linestyle=":", label=f"{goal_fixed:g}: exact below (fp32)")
    ax.set_xscale("log")
    ax.set_xlim(1e-10, 10)
    ax.set_yticks(y, [label for _, label in CASES])
    ax.set_xlabel("max |gradient - one-process gradient|")
    ax.set_title(f"uneven tokens: samples with {', '.join(map(str, uneven['counts']))} valid targets",
                 fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig


def matrix_figure(result: dict):
    """Left: loss per step of one process, of every configuration, and of the seeded bug.
    Right: each configuration's largest loss and weight difference from one process."""
    rows = result["rows"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5.2), gridspec_kw={"width_ratios": [1, 1.3]})
    ref = result["reference"]["dense"]
    steps = np.arange(1, len(ref) + 1)
    for i, r in enumerate(rows):
        left.plot(steps, r["losses"], color="tab:blue", alpha=0.4, linewidth=1,
                  label=f"{len(rows)} configurations" if i == 0 else None)
    left.plot(steps, ref, color="black", linestyle="--", marker="o", markersize=4, label="one process (dense)")
    left.plot(steps, result["reference"]["moe"], color="gray", linestyle=":", marker="s", markersize=4,
              label="one process (MoE, for EP)")
    if "seeded_bug" in result:
        left.plot(steps, result["seeded_bug"]["losses"], color="tab:red", marker="x",
                  label="DP x CP, seeded bug")
    left.set_xlabel("step")
    left.set_ylabel("loss (per valid token)")
    left.set_xticks(steps)
    left.legend(fontsize=8, loc="lower left")
    left.set_title("loss curves: the configurations lie on one process's", fontsize=10)
    y = np.arange(len(rows))
    right.barh(y + 0.2, [r["loss_diff"] for r in rows], height=0.38, color="tab:blue", label="max |loss diff|")
    right.barh(y - 0.2, [r["param_diff"] for r in rows], height=0.38, color="tab:orange",
               label="max |weight diff| after the steps")
    right.axvline(1e-5, color="black", linestyle=":", label="1e-5 goal (fp32)")
    right.set_xscale("log")
    right.set_xlim(1e-10, 1e-3)
    right.set_yticks(y, [r["name"] for r in rows], fontsize=8)
    right.invert_yaxis()
    right.set_xlabel("difference from one process on the whole batch")
    right.legend(fontsize=8, loc="lower right")
    right.set_title("every configuration against one process", fontsize=10)
    fig.tight_layout()
    return fig
