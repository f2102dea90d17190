"""Notebook 16's figures: who does which part of distributed training, and measured step times."""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.colors import ListedColormap

from source_code.figures import export

# who takes care of each part of a data-parallel training job: 0 you, 1 you with its help, 2 it
JOBS = ["join the process group", "model and batches on the device", "shard the data",
        "wrap the model (DDP / FSDP)", "write the training loop", "zero_grad / backward / step",
        "shard optimizer state, gradients, parameters", "start on Slurm without torchrun"]
WHO = {  # one column per script, in the order of JOBS
    "plain DDP": [0, 0, 0, 0, 0, 0, 0, 0],
    "Lightning": [2, 2, 1, 2, 2, 2, 1, 2],
    "Accelerate": [2, 2, 2, 2, 0, 1, 2, 0],
    "DeepSpeed": [2, 1, 0, 2, 0, 1, 2, 0],
}
LABELS = {0: "you", 1: "you, with its help", 2: "the framework"}


def responsibility_figure(name: str | None = "16_who_does_what.png"):
    names = list(WHO)
    grid = [[WHO[n][j] for n in names] for j in range(len(JOBS))]
    fig, ax = plt.subplots(figsize=(8, 4.2))
    ax.imshow(grid, cmap=ListedColormap(["#f3f3f3", "#9ecae1", "#3182bd"]), vmin=0, vmax=2, aspect="auto")
    for j, row in enumerate(grid):
        for i, who in enumerate(row):
            ax.text(i, j, LABELS[who], ha="center", va="center", fontsize=8,
                    color="white" if who == 2 else "black")
    ax.set_xticks(range(len(names)), names)
    ax.set_yticks(range(len(JOBS)), JOBS)
    ax.xaxis.tick_top()
    ax.set_title("Who writes which part of a data-parallel training job", pad=28)
    fig.tight_layout()
    export(fig, name)
    return fig


def step_time_figure(step_ms: dict, name: str | None = "16_step_times.png"):
    """Bar chart of milliseconds per step, one bar per run, the plain script's as a line."""
    fig, ax = plt.subplots(figsize=(7, 3))
    labels, values = list(step_ms), list(step_ms.values())
    ax.barh(labels, values, color=["#bbbbbb" if k.startswith("plain DDP") else "#3182bd" for k in labels])
    plain = [v for k, v in step_ms.items() if k.startswith("plain DDP")]
    if plain:
        ax.axvline(sum(plain) / len(plain), color="black", lw=1, ls="--", label="plain DDP (mean)")
        ax.legend(loc="lower right", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("milliseconds per optimizer step (2 processes, gloo on CPU)")
    fig.tight_layout()
    export(fig, name)
    return fig
