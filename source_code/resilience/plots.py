"""The figure of notebook 17: restart vs per-step fault tolerance, progress and loss against wall-clock time."""
from __future__ import annotations

import matplotlib.pyplot as plt


def _curve(events, **where):
    pts = sorted((e["t"], e["step"]) for e in events if e.get("event") == "step"
                 and e.get("committed", True) and all(e.get(k) == v for k, v in where.items()))
    return [t for t, _ in pts], [s for _, s in pts]


def _key(d: dict, k: int):
    return k if k in d else str(k)      # JSON turns the integer keys into strings


def progress_figure(res: dict):
    """Left: the torchrun job restarted from its snapshot; middle: torchft's replica groups (both
    against seconds since the kill, global step committed, held until the next commit); right:
    the eval loss of the model each run held (from each step's commit; a restart holds its
    snapshot's from the kill on) against seconds since the kill, with the time at which the
    losses are compared."""
    ft, rs = res["ft"], res["restart"]
    fig, (left, mid, right) = plt.subplots(1, 3, figsize=(13, 4.4))
    mid.sharex(left)
    mid.sharey(left)
    for attempt, style in ((0, "-"), (1, "--")):
        t, s = _curve(rs["events"][_key(rs["events"], 0)], attempt=attempt)
        left.plot([x - rs["kill_t"] for x in t], s, style, color="tab:blue", drawstyle="steps-post",
                  label=f"restart: attempt {attempt}" + (" (from the snapshot)" if attempt else ""))
    left.set_title(f"restart from a snapshot: {rs['steps_lost']} steps lost", fontsize=10)
    # the survivor wide and pale underneath, the victim thin on top: both stay visible
    t, s = _curve(ft["events"][_key(ft["events"], 0)])
    mid.plot([x - ft["kill_t"] for x in t], s, "-", color="tab:green", lw=4, alpha=0.45, drawstyle="steps-post",
             label="torchft: replica 0 (survives)")
    for attempt, style in ((0, "-"), (1, "--")):
        t, s = _curve(ft["events"][_key(ft["events"], 1)], attempt=attempt)
        if t:
            mid.plot([x - ft["kill_t"] for x in t], s, style, color="tab:red", lw=1.2, drawstyle="steps-post",
                     marker="." if attempt else None, ms=4,
                     label=f"torchft: replica 1, attempt {attempt}" + (" (healed)" if attempt else ""))
    if ft["heal_step"]:
        heal_t = next(e["t"] for evs in ft["events"].values() for e in evs if e.get("event") == "healed")
        mid.annotate(f"heal: state of step {ft['heal_step'] - 1}\nfrom replica 0, no file",
                     xy=(heal_t - ft["kill_t"], ft["heal_step"]), xytext=(0.35, 0.25),
                     textcoords="axes fraction", fontsize=8, arrowprops={"arrowstyle": "->", "lw": 0.8})
    mid.set_title(f"torchft: {ft['steps_lost']} steps lost, {ft['discarded']} discarded", fontsize=10)
    for ax in (left, mid):
        ax.axvline(0, color="black", lw=0.8, ls=":", label="the kill")
        ax.set_xlabel("seconds since the kill")
    left.set_ylabel("global step committed")
    for run, name, color in ((rs, "restart", "tab:blue"), (ft, "torchft", "tab:green")):
        ev, kill = run["evals"], run["kill_t"] - run["start_t"]
        right.plot([e["seconds"] - kill for e in ev], [e["eval_loss"] for e in ev], ".-", color=color, ms=3,
                   drawstyle="steps-post", label=f"{name}: eval loss of the model held")
    right.axvline(0, color="black", lw=0.8, ls=":")
    right.axvline(res["equal_seconds_after_kill"], color="grey", lw=0.8, ls="--", label="equal time")
    right.set_xlabel("seconds since the kill")
    right.set_ylabel("eval loss (256 fixed samples)")
    right.set_title("loss against wall-clock time", fontsize=10)
    keys = {}
    for ax in (left, mid, right):
        for handle, label in zip(*ax.get_legend_handles_labels()):
            keys.setdefault(label, handle)
    fig.tight_layout(rect=(0, 0.15, 1, 1))
    fig.legend(list(keys.values()), list(keys), loc="lower center", ncol=4, fontsize=8, frameon=False)
    return fig
