"""When each method pays off: simulated time to a target loss, per link.

A run's quality comes from training here (its held-out loss every few steps, ``harness.train``);
its time on a link from the link model: each step costs a compute time plus the link time of
the collectives it issued, their bytes scaled to the model size asked for
(``harness.replay_time``). ``time_to_target`` is the simulated time of the first evaluation
whose held-out loss is at or below the target; None when the run never gets there. ``table`` does it for every run and
link, ``winners`` names the fastest method per link.
"""
from __future__ import annotations

from source_code.less_communication.harness import replay_time


def time_to_target(run: dict, link, target: float, compute_s: float | None = None,
                   scale: float = 1.0) -> float | None:
    times = replay_time(run, link, compute_s, scale)
    for step, loss in run["evals"]:
        if loss <= target:
            return times[step - 1]
    return None


def table(runs: dict, link_names, target: float, compute_s: float | None = None,
          scale: float = 1.0) -> dict:
    """{link: {method: seconds or None}}; one compute time for all when ``compute_s`` is given
    (the same model computes the same steps: a method's own hook work is left out then)."""
    return {name: {m: time_to_target(r, name, target, compute_s, scale) for m, r in runs.items()}
            for name in link_names}


def winners(tab: dict) -> dict:
    """{link: method that reached the target first (None if none did)}."""
    out = {}
    for name, row in tab.items():
        reached = {m: t for m, t in row.items() if t is not None}
        out[name] = min(reached, key=reached.get) if reached else None
    return out
