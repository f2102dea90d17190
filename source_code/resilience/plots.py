"""The figure of notebook 17: training progress against wall-clock time, restart vs per-step fault tolerance."""
from __future__ import annotations

import matplotlib.pyplot as plt


def _curve(events, **where):
    pts = sorted((e["t"], e["step"]) for e in events if e.get("event") == "step"
                 and e.get("committed", True) and all(e.get(k) == v for k, v in where.items()))
    return [t for t, _ in pts], [s for _, s in pts]


def progress_figure(res: dict):
    """Left: the torchrun job restarted from its snapshot; right: torchft's replica groups.
    Both panels share the axes (seconds since the kill, global step)."""
    ft_ev, rs_ev = res["ft"]["events"], res["restart"]["events"]
    kill_t = {name: next(e["t"] for evs in ev.values() for e in evs if e.get("event") == "kill")
              for name, ev in (("ft", ft_ev), ("restart", rs_ev))}
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.4), sharex=True, sharey=True)
    for attempt, style in ((0, "-"), (1, "--")):
        t, s = _curve(rs_ev[_key(rs_ev, 0)], attempt=attempt)
        left.plot([x - kill_t["restart"] for x in t], s, style, color="tab:blue",
                  label=f"rank 0, attempt {attempt}" + (" (after the restart)" if attempt else ""))
    left.set_title(f"restart from a snapshot: {res['restart']['steps_lost']} steps lost")
    for r, color in ((0, "tab:green"), (1, "tab:red")):
        for attempt, style in ((0, "-"), (1, "--")):
            t, s = _curve(ft_ev[_key(ft_ev, r)], attempt=attempt)
            if t:
                right.plot([x - kill_t["ft"] for x in t], s, style, marker="." if attempt else None,
                           color=color, label=f"replica {r}, attempt {attempt}"
                           + (" (healed from a peer)" if attempt else ""))
    right.set_title(f"per-step fault tolerance (torchft): {res['ft']['steps_lost']} steps lost")
    for ax in (left, right):
        ax.axvline(0, color="black", lw=0.8, ls=":", label="the kill")
        ax.set_xlabel("seconds since the kill")
    left.set_ylabel("global step completed")
    # one key under both panels (the curves fill the panels' upper left, where a key would sit)
    keys = {}
    for ax in (left, right):
        for handle, label in zip(*ax.get_legend_handles_labels()):
            keys.setdefault(label, handle)
    fig.tight_layout(rect=(0, 0.16, 1, 1))
    fig.legend(list(keys.values()), list(keys), loc="lower center", ncol=3, fontsize=8, frameon=False)
    return fig


def _key(d: dict, k: int):
    return k if k in d else str(k)      # JSON turns the integer keys into strings
