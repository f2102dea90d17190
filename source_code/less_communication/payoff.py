"""When each method pays off: time to a target loss on a link, and the link speed where two swap.

A run's quality comes from training here (its held-out loss at the steps where its workers
agree, ``harness.train``); its time on a link from the link model. To reach a target a method
needs n steps (``steps_to_target``: where its held-out loss curve, linear between evaluations,
first comes down to the target; averaged over seeds by the caller); each of its steps sends on
average M messages and B bytes per rank (its collectives as the run counted them, the bytes
scaled to the model size asked for: ``terms``). Those n steps cost

    T = n (c + M alpha + B / beta)

c the compute time of a step (the 6 N T rule for that model, links.py), alpha and beta the
link's latency and bandwidth. ``table`` gives T for every method and link, ``winners`` the
fastest per link. Two methods a and b take equally long on links of latency alpha where

    beta* = (B_a - B_b) / ((n_b - n_a) c + (M_b - M_a) alpha)         (totals over the n steps)

(``crossover``): above that bandwidth the one with more steps loses, below it the one with
more bytes. None when one of them is at least as fast on every bandwidth.
"""
from __future__ import annotations

from source_code.less_communication import links


def steps_to_target(run: dict, target: float) -> float | None:
    """Steps the run trained (from its start) until its held-out loss, linear between its
    evaluations, comes down to ``target``; None if it never does."""
    evals, first = run["evals"], run["first"]
    for (s0, l0), (s1, l1) in zip(evals, evals[1:]):
        if l1 <= target:
            return s0 - first + (s1 - s0) * (l0 - target) / (l0 - l1) if l0 > target else s0 - first
    return None


def terms(run: dict, steps: float | None, scale: float = 1.0) -> dict | None:
    """{"steps": n, "messages": n M, "sent": n B}: ``steps`` steps of ``run``'s average step."""
    if steps is None:
        return None
    messages = sent = 0.0
    for ops in run["ops"]:
        for kind, nbytes in ops:
            m, b = links.collective_terms(kind, nbytes * scale, run["world"])
            messages, sent = messages + m, sent + b
    n = len(run["ops"])
    return {"steps": steps, "messages": steps * messages / n, "sent": steps * sent / n}


def seconds(t: dict | None, link, compute_s: float) -> float | None:
    """T = n c + messages alpha + bytes / beta (None: the target was never reached)."""
    if t is None:
        return None
    lk = links.link(link) if isinstance(link, str) else link
    return t["steps"] * compute_s + t["messages"] * lk.alpha + t["sent"] / lk.beta


def table(ts: dict, link_names, compute_s: float) -> dict:
    """{link: {method: seconds or None}} for ``terms`` per method: one compute time for all
    (the same model computes the same steps; a method's own extra compute is left out)."""
    return {name: {m: seconds(t, name, compute_s) for m, t in ts.items()} for name in link_names}


def winners(tab: dict) -> dict:
    """{link: method that reached the target first (None if none did)}."""
    out = {}
    for name, row in tab.items():
        reached = {m: t for m, t in row.items() if t is not None}
        out[name] = min(reached, key=reached.get) if reached else None
    return out


def crossover(a: dict, b: dict, alpha: float, compute_s: float) -> float | None:
    """The bandwidth (bytes/s) at which ``a`` and ``b`` (``terms``) take equally long on links
    of latency ``alpha``; None if one is at least as fast on every bandwidth."""
    if a is None or b is None:
        return None
    fixed = (b["steps"] - a["steps"]) * compute_s + (b["messages"] - a["messages"]) * alpha
    if fixed == 0 or (a["sent"] - b["sent"]) / fixed <= 0:
        return None
    return (a["sent"] - b["sent"]) / fixed
