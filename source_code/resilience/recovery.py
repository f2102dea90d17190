"""Measuring a recovery from the runs' step logs: steps and samples lost, time without progress, goodput.

The same numbers for both ways of surviving a failure, counted from the events the runs log
(``common.StepLog``: every step with its wall-clock time, samples and whether its update was
applied; the kill; the resume; the evaluations), never set by the code that is measured:
* steps lost: the steps the job had committed when the kill landed minus the step it goes on
  from (a restart goes on from its snapshot; per-step fault tolerance from wherever the
  survivors' first step after the kill starts: 0 unless they rolled back);
* seconds without progress: from the kill to the first step the job commits after it;
* samples, two things that are not added up: samples **lost** (``skipped``: in a committed
  step's global batch but trained by no group, the slice of a group that was down: never
  trained) and sample computations **thrown away** (``thrown_away``: computed for nothing: steps
  rolled back, the step in flight, a discarded step, a healing group's zero contribution; the
  samples may be trained in another computation, as a restart's redone steps are);
* the same window for both ways (``window``): from the kill to the commit of one global step
  ``S`` at which both are back at full batch (the first step torchft trains with every group
  again); each run's seconds there, the samples of steps kill+1..S it trained and its goodput
  (those samples per second). Per failure, not per run length; what a run pays on every step,
  failure or not, is its step before the kill (``step_seconds``, the median), not counted here.
  The window's seconds mix the failure's cost with the pace of the steps in it, which can differ
  between two runs made one after the other: ``split_window`` separates them (torchft's heal
  step, in which the returning group first receives the state, counts as the failure's
  beyond the pace of the window's other steps), and ``goodput_at_pace`` gives the goodput of both
  at one pace;
* the model each run held against time (``evals``: from the commit of each evaluated step by the
  first process to commit it, the same moment as ``commits``; for a restart the snapshot's model
  from the kill until its redone steps commit, the first attempt's later evaluations dropped),
  for losses at equal steps and at equal time after the kill.
"""
from __future__ import annotations

from typing import NamedTuple


class Held(NamedTuple):
    """One evaluated model, held by the job from ``seconds`` on."""
    seconds: float
    step: int
    attempt: int


def _steps(events, **where):
    return [e for e in events if e.get("event") == "step" and all(e.get(k) == v for k, v in where.items())]


def _kill(events_by_rank: dict) -> dict:
    kills = [e for evs in events_by_rank.values() for e in evs if e.get("event") == "kill"]
    if len(kills) != 1:
        raise ValueError(f"expected one kill in the logs, found {len(kills)}")
    return kills[0]


def _evals(events_by_rank: dict, t0: float, commit_of, rollback: tuple | None = None) -> list:
    """The model the job held from each moment on: every evaluation (the final one, in the
    ``end`` event, included) dated by ``commit_of(attempt, step)``, the moment the run's
    ``commits`` give that step (the first process to commit it: evaluations and commits on one
    clock, whichever rank logged the evaluation). ``rollback`` = (time, step): a restarted job
    holds its snapshot's model from the kill on (attempt 0's evaluation of that step), and
    nothing attempt 0 evaluated counts after the kill."""
    held = {}                                  # Held(seconds, step, attempt) -> eval loss
    for evs in events_by_rank.values():
        attempt = 0
        for e in evs:
            if e.get("event") == "step":
                attempt = e.get("attempt", 0)
            elif e.get("event") in ("eval", "end") and "eval_loss" in e:
                committed = commit_of(attempt, e["step"])
                if committed is not None:
                    held[Held(committed - t0, e["step"], attempt)] = e["eval_loss"]
    if rollback is not None:
        kill, step = rollback[0] - t0, rollback[1]
        snapshot_loss = [loss for h, loss in held.items() if h.step == step and h.attempt == 0]
        held = {h: loss for h, loss in held.items() if h.attempt != 0 or h.seconds <= kill}
        if snapshot_loss:
            held[Held(kill, step, 0)] = snapshot_loss[-1]
    return [{"seconds": h.seconds, "step": h.step, "eval_loss": held[h]} for h in sorted(held)]


def _first_commits(events: list) -> dict:
    """(attempt, step) -> the moment the first process committed it."""
    first = {}
    for e in sorted(events, key=lambda e: e["t"]):
        if e.get("committed", True):
            first.setdefault((e.get("attempt", 0), e["step"]), e["t"])
    return first


def _median(values: list) -> float:
    values = sorted(values)
    return values[len(values) // 2] if values else float("nan")


def _step_seconds(commits: dict, before: int) -> float:
    """The median time between consecutive committed steps up to ``before`` (no failure yet)."""
    return _median([commits[s] - commits[s - 1] for s in commits if s <= before and s - 1 in commits])


def window(run: dict, kill_step: int, until: int, batch_size: int) -> dict:
    """From the kill to the commit of global step ``until``: ``run`` is ft_metrics' or
    restart_metrics' result (``commits``: step -> time committed; ``trained``: step -> samples)."""
    steps = range(kill_step + 1, until + 1)
    seconds = run["commits"][until] - run["kill_t"]
    trained = sum(run["trained"].get(s, 0) for s in steps)
    return {"until_step": until, "seconds": seconds, "samples_trained": trained,
            "samples_missing": len(steps) * batch_size - trained, "goodput": trained / seconds}


DISCARDED, QUORUM_ALONE = "the step the kill landed in (discarded)", "quorum waits without the dead group"
HEAL = "the heal step (group 1 receives the state)"
REJOIN = {"quorum": "after the heal step: quorum waits", "allreduce": "after the heal step: all-reduce waits",
          "commit": "after the heal step: commit votes"}
IN_STEPS, BETWEEN = "in the steps: compute, the other waits", "between the steps: evaluation, floor, log"


def _survivor_steps(run: dict, events: dict, victim: int, until: int):
    """The first survivor's steps from the kill to its commit of ``until``: (event, seconds since
    the previous commit (or the kill), seconds before the step began, its timed waits)."""
    survivor = min(r for r in events if r != victim)
    end, previous = run["commits"][until], run["kill_t"]
    for e in sorted(_steps(events[survivor]), key=lambda e: e["t"]):
        if run["kill_t"] < e["t"] <= end:
            waits = {name: e.get(f"{name}_s", 0.0) for name in REJOIN}
            yield e, e["t"] - previous, max(0.0, e["begun"] - previous), waits
            previous = e["t"]


def ft_time_parts(run: dict, events: dict, victim: int, until: int) -> dict:
    """Where the first survivor's seconds from the kill to its commit of step ``until`` went,
    from its step log (each step's waits timed by ft_replica.time_waits). The parts add up to
    the window's seconds: the step the kill landed in (thrown away); the quorum waits before
    the heal (a dead group's heartbeats must go stale); the heal step, whole, from the commit
    before it to its own (the returning group receives the state before it joins the
    all-reduce); the quorum, all-reduce and commit waits after it; the rest of the steps; and the
    time between steps (the harness's evaluation, the ``--step-seconds`` floor, the log)."""
    parts = dict.fromkeys((DISCARDED, QUORUM_ALONE, HEAL, *REJOIN.values(), IN_STEPS, BETWEEN), 0.0)
    for e, seconds, between, waits in _survivor_steps(run, events, victim, until):
        if not e["committed"]:
            parts[DISCARDED] += seconds
            continue
        if e["step"] == run["heal_step"]:
            parts[HEAL] += seconds
            continue
        parts[BETWEEN] += between
        if run["heal_step"] is not None and e["step"] > run["heal_step"]:
            for name, waited in waits.items():
                parts[REJOIN[name]] += waited
            parts[IN_STEPS] += seconds - between - sum(waits.values())
        else:
            parts[QUORUM_ALONE] += waits["quorum"]
            parts[IN_STEPS] += seconds - between - waits["quorum"]
    return parts


def longest_pause(run: dict, events: dict, victim: int, until: int) -> dict:
    """The survivor's longest time from one commit to the next after its first commit without
    the dead group (the heartbeat wait excluded), up to ``until``, and where it went."""
    after = [(e, seconds, between, waits) for e, seconds, between, waits in _survivor_steps(run, events, victim, until)
             if e["committed"]][1:]
    if not after:
        return {}
    e, seconds, between, waits = max(after, key=lambda x: x[1])
    return {"step": e["step"], "seconds": seconds, "between": between, **waits,
            "in_step": seconds - between - sum(waits.values())}


RELAUNCH, REDONE, NEW_STEPS = ("relaunch (to a restarted worker's start)", "snapshot read, lost steps redone",
                               "new steps")


# the parts of each window in which no new step could be made: the failure's own cost; and the
# parts that each hold one new step made longer by the failure (torchft's heal step), whose
# seconds beyond the pace of the window's other new steps are the failure's too
FAILURE_PARTS = {"torchft": (DISCARDED, QUORUM_ALONE), "restart": (RELAUNCH, REDONE)}
LONGER_STEPS = {"torchft": (HEAL,), "restart": ()}


def split_window(window: dict, failure_parts: tuple, steps: int, longer_steps: tuple = ()) -> dict:
    """A window's seconds (``window["parts"]`` filled in) in two: the failure's (its
    ``failure_parts``: no new step possible, and the excess of each of its ``longer_steps``
    present over the pace of the other steps) and the stepping (the window's ``steps`` new
    global steps at that pace: the run's own pace there, which load and per-step work set)."""
    failure = sum(window["parts"][p] for p in failure_parts)
    longer = [window["parts"][p] for p in longer_steps if window["parts"].get(p)]
    pace = (window["seconds"] - failure - sum(longer)) / (steps - len(longer))
    excess = sum(longer) - len(longer) * pace
    return {"failure_s": failure + excess, "longer_steps_excess_s": excess, "stepping_s": steps * pace,
            "pace_s": pace}


def goodput_at_pace(window: dict, steps: int, pace_s: float) -> float:
    """The window's samples per second had its ``steps`` new steps taken ``pace_s`` each,
    the failure's seconds unchanged (``split_window``'s figures in ``window``)."""
    return window["samples_trained"] / (window["failure_s"] + steps * pace_s)


def restart_time_parts(run: dict, events: dict, until: int) -> dict:
    """Where a restarted job's seconds from the kill to its commit of step ``until`` went: the
    relaunch (to the first restarted worker's start), reading the snapshot and redoing the
    steps it lost (to the commit of the last of them), the new steps from the one the kill
    landed in on."""
    starts = [e["t"] for evs in events.values() for e in evs if e.get("event") == "start" and e.get("attempt") == 1]
    started = min(starts) if starts else run["kill_t"]
    redone = max(started, run["commits"][run["kill_step"]])
    return {RELAUNCH: started - run["kill_t"], REDONE: redone - started, NEW_STEPS: run["commits"][until] - redone}


def loss_at_seconds(evals: list, seconds: float) -> dict:
    """The model held ``seconds`` after the run's start: the last one committed by then (a step
    committed at that very moment counts, up to a microsecond of rounding)."""
    before = [e for e in evals if e["seconds"] <= seconds + 1e-6]
    return before[-1] if before else {"seconds": 0.0, "step": 0, "eval_loss": float("nan")}


def loss_at_step(evals: list, step: int) -> dict:
    """The last evaluation at or before global step ``step`` (the latest one logged there)."""
    before = [e for e in evals if e["step"] <= step]
    return max(before, key=lambda e: (e["step"], e["seconds"])) if before else \
        {"seconds": 0.0, "step": 0, "eval_loss": float("nan")}


def heal_order(events: dict, victim: int, heal_step) -> dict:
    """The moments of the heal step, from the logs (ft_replica.time_waits): when the returning
    group had received the state, when the first survivor's last all-reduce wait of that step
    returned, and when its commit vote began (None where not logged)."""
    survivor = min(r for r in events if r != victim)

    def at(r):
        return next((e for e in _steps(events[r]) if e["committed"] and e["step"] == heal_step), {})
    back, peer = at(victim), at(survivor)
    return {"received": back.get("received_t"), "allreduce_done": peer.get("allreduce_done_t"),
            "commit_begun": peer.get("commit_begun_t")}


def asked_last(events: dict, before_t: float) -> dict:
    """Group -> the number of steps, committed by every group before ``before_t``, for which it
    was the last to ask for the quorum (``asked_t``, logged by ft_replica.time_waits when the
    step calls ``start_quorum``; one clock, one machine)."""
    asked = {}
    for r, evs in events.items():
        for e in _steps(evs):
            if e["committed"] and e["t"] <= before_t and "asked_t" in e:
                asked.setdefault(e["step"], {})[r] = e["asked_t"]
    counts = dict.fromkeys(events, 0)
    for by_group in asked.values():
        if len(by_group) == len(events):
            counts[max(by_group, key=by_group.get)] += 1
    return counts


def ft_metrics(events: dict, victim: int, batch_size: int) -> dict:
    """``events``: replica group -> its log. The survivors keep the job going; the victim heals."""
    kill = _kill(events)
    survivors = [r for r in events if r != victim]
    mine = [e for r in survivors for e in _steps(events[r])]
    done_at_kill = max((e["step"] for e in mine if e["committed"] and e["t"] <= kill["t"]), default=0)
    after = sorted((e for e in mine if e["committed"] and e["t"] > kill["t"]), key=lambda e: e["t"])
    if not after:
        raise ValueError("no surviving replica committed a step after the kill")
    every = [e for evs in events.values() for e in _steps(evs)]
    t0 = min(e["begun"] for e in every)
    trained, committed_steps = {}, {e["step"] for e in every if e["committed"]}
    for e in every:
        if e["used"]:
            trained[e["step"]] = trained.get(e["step"], 0) + e["samples"]
    computed = sum(e["samples"] for e in every) + kill["samples"]
    n_trained = sum(trained.values())
    healed = [e for evs in events.values() for e in evs if e.get("event") == "healed"]
    ends = [e for evs in events.values() for e in evs if e.get("event") == "end"]
    bitwise = len(ends) == len(events) and len({(e["digest"], e["step"]) for e in ends}) == 1
    last = max(e["t"] for e in every if e["committed"])
    commits = {}
    for e in sorted(mine, key=lambda e: e["t"]):
        if e["committed"]:
            commits.setdefault(e["step"], e["t"])                       # the first group to commit it
    full = [s for s in sorted(commits) if s > kill["step"] and trained.get(s, 0) == batch_size]
    return {"kill_step": kill["step"], "kill_t": kill["t"], "start_t": t0,
            "steps_lost": done_at_kill - after[0]["before"],
            "seconds_without_progress": after[0]["t"] - kill["t"],
            "discarded": sum(1 for e in mine if not e["committed"] and e["t"] > kill["t"]),
            "heal_step": healed[0]["step"] if healed else None,
            "heal_order": heal_order(events, victim, healed[0]["step"]) if healed else None,
            "healed_from_peer": bool(healed), "bitwise_equal": bitwise,
            "heal_bitwise_equal": bool(healed) and bitwise,
            # steps committed by the survivors alone before the heal step (in the heal step the
            # returning group receives the state and its gradient counts as zero)
            "survivor_steps_while_down": sum(1 for e in after if e["participants"] < len(events)
                                             and (not healed or e["step"] < healed[0]["step"])),
            "samples_trained": n_trained, "samples_thrown_away": computed - n_trained,
            # never trained: in a committed step's global batch, trained by no group
            "samples_lost": sum(batch_size - trained.get(s, 0) for s in committed_steps),
            "seconds": last - t0, "commits": commits, "trained": trained,
            "step_seconds": _step_seconds(commits, kill["step"]),
            # each group's own waits on a step when nothing fails (median before the kill): the
            # group that asks for the quorum last waits for the lighthouse alone (torchft's cost),
            # another one also for that group to ask (the slowest peer, which DDP waits for too);
            # the all-reduce waits are the harness's gradient all-reduces through the Manager
            "waits_per_step_s": {r: {name: _median([e.get(f"{name}_s", 0.0) for e in _steps(evs)
                                                    if e["committed"] and e["t"] <= kill["t"]])
                                     for name in ("quorum", "allreduce", "commit")} for r, evs in events.items()},
            "asked_last": asked_last(events, kill["t"]),
            "full_step": full[0] if full else None,          # back at full batch (every group)
            "final_step": max(e["step"] for e in ends) if ends else None,
            "final_loss": ends[0]["eval_loss"] if ends else float("nan"),
            "evals": _evals(events, t0, lambda attempt, step: commits.get(step))}


def restart_metrics(events: dict, batch_size: int) -> dict:
    """``events``: rank -> its log of a torchrun job killed once and started again from its snapshot."""
    kill = _kill(events)
    resumed = [e for evs in events.values() for e in evs if e.get("event") == "resume"]
    start = resumed[0]["step"] if resumed else 0
    every = [e for evs in events.values() for e in _steps(evs)]
    again = sorted((e for e in every if e["attempt"] == 1), key=lambda e: e["t"])
    if not again:
        raise ValueError("the restarted job logged no step")
    # the final model descends from attempt 0 up to the snapshot, then from attempt 1
    lineage = [e for e in every if (e["attempt"] == 0 and e["step"] <= start) or e["attempt"] == 1]
    trained = {}
    for e in lineage:
        trained[e["step"]] = trained.get(e["step"], 0) + e["samples"]
    computed = sum(e["samples"] for e in every) + kill["samples"]
    n_trained = sum(trained.values())
    skipped = sum(batch_size - n for n in trained.values())
    caught_up = next((e for e in again if e["step"] >= kill["step"]), again[-1])
    snaps = [e["seconds"] for evs in events.values() for e in evs if e.get("event") == "snapshot"]
    commits = {}
    for e in sorted(lineage, key=lambda e: e["t"]):
        commits.setdefault(e["step"], e["t"])                           # the first rank to commit it, as for torchft
    first = _first_commits(every)
    ends = [e for evs in events.values() for e in evs if e.get("event") == "end"]
    t0, last = min(e["begun"] for e in every), max(e["t"] for e in again)
    return {"kill_step": kill["step"], "kill_t": kill["t"], "start_t": t0, "resumed_from": start,
            "steps_lost": kill["step"] - start,
            "seconds_without_progress": again[0]["t"] - kill["t"],
            "seconds_to_catch_up": caught_up["t"] - kill["t"],
            # Daly's R: from the kill until work resumes (the restarted workers have read the snapshot)
            "seconds_to_resume": min((e["t"] for e in resumed if e.get("attempt", 1) >= 1),
                                     default=again[0]["begun"]) - kill["t"],
            "snapshot_seconds": _median(snaps), "commits": commits, "trained": trained,
            "step_seconds": _step_seconds(commits, start),
            "samples_trained": n_trained, "samples_thrown_away": computed - n_trained,
            "samples_lost": skipped,
            "seconds": last - t0,
            "final_step": ends[0]["step"] if ends else None,
            "final_loss": ends[0]["eval_loss"] if ends else float("nan"),
            "evals": _evals(events, t0, lambda attempt, step: first.get((attempt, step)),
                            rollback=(kill["t"], start))}


def main(argv=None) -> int:
    """``python -m source_code.resilience.recovery LOG_DIR --victim 1 --batch-size 32``: the
    torchft run's figures from its replicas' logs (replica_<r>.jsonl); exit status 0 only when
    the survivors lost no step, threw away the step the kill landed in, and the killed group
    came back bitwise equal to its peers."""
    import argparse
    import glob
    import os
    import re
    from source_code.resilience.common import read_log
    p = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
    p.add_argument("log_dir")
    p.add_argument("--victim", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=32)
    a = p.parse_args(argv)
    paths = glob.glob(os.path.join(a.log_dir, "replica_*.jsonl"))
    events = {int(re.search(r"replica_(\d+)", path).group(1)): read_log(path) for path in paths}
    try:
        m = ft_metrics(events, a.victim, a.batch_size)
    except (ValueError, KeyError) as err:
        print(f"error: the logs in {a.log_dir} do not show a kill and a recovery: {err}")
        return 1
    ok = m["steps_lost"] == 0 and m["discarded"] >= 1 and m["heal_bitwise_equal"]
    print(f"summary: groups={len(events)} ft_steps_lost={m['steps_lost']} ft_discarded_steps={m['discarded']} "
          f"ft_samples_lost={m['samples_lost']} ft_samples_thrown_away={m['samples_thrown_away']} seconds_without_progress={m['seconds_without_progress']:.2f} "
          f"heal_step={m['heal_step']} heal_bitwise_equal={int(m['heal_bitwise_equal'])} final_step={m['final_step']}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
