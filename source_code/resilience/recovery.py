"""Measuring a recovery from the runs' step logs: steps lost, seconds without progress, the heal.

The same two numbers for both ways of surviving a failure, read from the events the runs log
(``common.StepLog``: wall-clock time of every finished step, the kill, the snapshot reads):
* steps lost: the last step finished before the kill minus the step the job goes on from
  (a restart goes on from its snapshot; per-step fault tolerance from where the survivors are);
* seconds without progress: from the kill to the first step beyond the killed step's
  predecessor that the job completes (the first new step).
"""
from __future__ import annotations


def _steps(events, **where):
    return [e for e in events if e.get("event") == "step" and all(e.get(k) == v for k, v in where.items())]


def _kill(events_by_rank: dict) -> dict:
    kills = [e for evs in events_by_rank.values() for e in evs if e.get("event") == "kill"]
    if len(kills) != 1:
        raise ValueError(f"expected one kill in the logs, found {len(kills)}")
    return kills[0]


def ft_metrics(events: dict, victim: int) -> dict:
    """``events``: replica -> its log. The survivors keep the job going; the victim heals."""
    kill = _kill(events)
    survivors = [r for r in events if r != victim]
    after = [e for r in survivors for e in _steps(events[r], committed=True) if e["step"] > kill["step"]]
    if not after:
        raise ValueError("no surviving replica committed a step after the kill")
    first = min(after, key=lambda e: e["t"])
    back = [e for e in _steps(events[victim], attempt=1)]
    healed = back[0] if back else None
    ends = [e for evs in events.values() for e in evs if e.get("event") == "end"]
    digests = {e["digest"] for e in ends}
    # the discarded attempts: steps a survivor computed but did not commit (the peer vanished mid-step)
    discarded = sum(1 for r in survivors for e in _steps(events[r], committed=False))
    return {"kill_step": kill["step"], "steps_lost": kill["step"] - first["before"],
            "seconds_without_progress": first["t"] - kill["t"], "discarded": discarded,
            "heal_step": healed["step"] if healed else None,
            "healed_from_peer": bool(healed and healed["before"] == 0 and healed["step"] > 1),
            "bitwise_equal": len(ends) == len(events) and len(digests) == 1,
            "final_step": max(e["step"] for e in ends) if ends else None,
            "final_loss": ends[0]["eval_loss"] if ends else float("nan"),
            "loss_at_steps": next((e["eval_loss"] for r in survivors for e in events[r]
                                   if e.get("event") == "at_steps"), float("nan")),
            "survivor_steps_while_down": sum(1 for r in survivors for e in _steps(events[r], committed=True)
                                             if healed and kill["t"] < e["t"] < healed["t"])}


def restart_metrics(events: dict) -> dict:
    """``events``: rank -> its log of a torchrun job restarted from its snapshot after the kill."""
    kill = _kill(events)
    resumed = [e for evs in events.values() for e in evs if e.get("event") == "resume"]
    start = resumed[0]["step"] if resumed else 0
    again = sorted(_steps(events[0], attempt=1), key=lambda e: e["t"])
    if not again:
        raise ValueError("the restarted job logged no step")
    caught_up = next((e for e in again if e["step"] >= kill["step"]), again[-1])
    snaps = [e["seconds"] for evs in events.values() for e in evs if e.get("event") == "snapshot"]
    steps0 = sorted(_steps(events[0], attempt=0), key=lambda e: e["t"])
    gaps = [b["t"] - a["t"] for a, b in zip(steps0, steps0[1:])]
    ends = [e for e in events[0] if e.get("event") == "end"]
    return {"kill_step": kill["step"], "resumed_from": start, "steps_lost": kill["step"] - start,
            "seconds_without_progress": again[0]["t"] - kill["t"],
            "seconds_to_catch_up": caught_up["t"] - kill["t"],
            "snapshot_seconds": sorted(snaps)[len(snaps) // 2] if snaps else float("nan"),
            "step_seconds": sorted(gaps)[len(gaps) // 2] if gaps else float("nan"),
            "final_step": ends[0]["step"] if ends else None,
            "final_loss": ends[0]["eval_loss"] if ends else float("nan")}
