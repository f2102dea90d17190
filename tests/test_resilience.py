"""Notebook 17's package: the waste model against brute force and drawn failures, the detection
rules and verdicts, the recovery figures on made-up logs (including outcomes the drills do not
produce: a rollback, a missing heal), one-line flag errors, and torchft's DDP hook failure.
The drills themselves run in the notebook under nbval; running them again here would cost the
suite another minute for the same processes."""
from __future__ import annotations

import math

import pytest
import torch

from source_code.errors import LaunchError
from source_code.resilience import (compare, elastic, elastic_history, ft_run, health_drill, recovery,
                                    rerun, reshard_drill, sdc, sdc_drill, stragglers, watchdog, young_daly)


@pytest.mark.parametrize("c,m", [(0.03, 86400.0), (30.0, 3600.0), (600.0, 7200.0), (5000.0, 3600.0)])
def test_best_interval_minimises_the_model_and_the_formulas_minimise_their_expansions(c, m):
    best = young_daly.best_interval(c, m)
    grid = [best * (1 + k / 1000) for k in range(-500, 501)]
    assert min(grid, key=lambda t: young_daly.waste_fraction(t, c, m)) == pytest.approx(best, rel=2e-3)
    if c < 2 * m:
        one = young_daly.first_order_interval(c, m)
        first = lambda t: c / (t + c) + t / (2 * m)
        assert min([one * (1 + k / 1000) for k in range(-500, 501)], key=first) == pytest.approx(one, rel=2e-3)
        # Daly's eq. 37 follows the model further: nearer its minimum than either first-order formula
        daly = young_daly.daly_higher_order(c, m)
        assert abs(daly - best) < min(abs(one - best), abs(young_daly.young_interval(c, m) - best)), (daly, one, best)
    assert young_daly.daly_first_order(c, m) == young_daly.young_interval(c, m)          # R = 0: Young's
    assert young_daly.daly_first_order(c, m, restart_s=m) == pytest.approx(2 ** 0.5 * young_daly.young_interval(c, m))
    young = young_daly.young_interval(c, m)
    first_young = lambda t: c / t + t / (2 * m)
    assert min([young * (1 + k / 1000) for k in range(-500, 501)], key=first_young) == pytest.approx(young, rel=2e-3)


def test_the_formulas_approach_the_model_only_for_a_cheap_snapshot():
    cheap, costly = (0.03, 86400.0), (600.0, 3600.0)
    for (c, m), close in ((cheap, True), (costly, False)):
        best = young_daly.waste_fraction(young_daly.best_interval(c, m), c, m)
        young = young_daly.waste_fraction(young_daly.young_interval(c, m), c, m)
        assert (young <= best * 1.001) is close, (c, m, best, young)
    assert young_daly.daly_higher_order(3 * 3600.0, 3600.0) == 3600.0     # Daly's tau = M for C >= 2M
    assert young_daly.first_order_interval(3 * 3600.0, 3600.0) == 3600.0
    assert 0 < young_daly.best_interval(3 * 3600.0, 3600.0) < 3600.0   # the model has its own


@pytest.mark.parametrize("c,m", [(30.0, 3600.0), (600.0, 3600.0)])
def test_the_model_matches_failures_drawn_at_random(c, m):
    for tau in (young_daly.best_interval(c, m), 2 * young_daly.best_interval(c, m)):
        assert young_daly.simulate(tau, c, m, failures=40000) == pytest.approx(
            young_daly.waste_fraction(tau, c, m), rel=0.02)


def test_flip_bit_changes_one_bit_and_the_checksum():
    t = torch.linspace(0.5, 2.0, 8)
    before = t.clone()
    model = torch.nn.Linear(2, 4)
    with torch.no_grad():
        model.weight.copy_(t.view(4, 2))
    c0 = sdc.checksum(model)
    sdc.flip_bit(model.weight, 7, 3)
    diff = (model.weight.detach().view(-1).view(torch.int32) ^ before.view(torch.int32))
    assert diff.count_nonzero() == 1 and int(diff[7]) == 8
    assert sdc.checksum(model) != c0


def test_verdicts_of_a_replay():
    assert sdc.state_verdict([2], []) == "transient"
    assert sdc.state_verdict([2], [2]) == "persistent"
    assert sdc.state_verdict([2], [1]) == "inconsistent"
    assert rerun.verdict(1e30, 3.0, None) == "transient"            # not reproduced on the same device
    assert rerun.verdict(1e30, 1e30, 3.0) == "persistent"           # reproduced there, not elsewhere
    assert rerun.verdict(1e30, 1e30, 1e30) == "correct"             # reproduced elsewhere too
    assert rerun.verdict(2.0, 2.0005, 2.0) == "correct"             # within Megatron's 0.1 %


def test_megatrons_rule_flags_spikes_nan_and_inf_after_its_warmup():
    assert not rerun.is_unexpectedly_large(100.0, [1.0])            # warm-up: too few values yet
    assert rerun.is_unexpectedly_large(10.0, [1.0, 0.8])
    assert not rerun.is_unexpectedly_large(9.9, [1.0, 0.8])
    assert rerun.is_unexpectedly_large(float("nan"), []) and rerun.is_unexpectedly_large(float("inf"), [])


def test_name_stragglers_and_stuck_ranks():
    assert stragglers.name_stragglers([0.010, 0.011, 0.060]) == [2]
    assert stragglers.name_stragglers([0.010, 0.011, 0.012]) == []
    with pytest.raises(ValueError):
        stragglers.name_stragglers([1.0], factor=1.0)
    report = {0: {"phase": "all_reduce", "stuck_s": 2.0}, 1: {"phase": "data", "stuck_s": 2.0},
              2: {"phase": "forward_backward", "stuck_s": 0.1}}       # rank 2: slow but moving
    assert watchdog.stuck_outside(report, 1.0) == [1]


def _ev(t, **kw):
    return {"t": t, **kw}


def _step(t, before, step, committed=True, participants=2, used=None, attempt=0, samples=16):
    return _ev(t, event="step", attempt=attempt, before=before, step=step, committed=committed,
               participants=participants, used=committed if used is None else used, samples=samples,
               begun=t - 0.5)


def _ft_logs(rollback: int = 0, heal: bool = True):
    """Two groups of 16 samples a step; group 1 dies in the all-reduce after step 3; group 0
    discards that step, goes on alone from step ``3 - rollback``; group 1 heals at step 6."""
    zero = [_step(s, s - 1, s) for s in range(1, 4)] + [_step(3.6, 3, 3, committed=False)]
    zero += [_step(5.0 + i, 3 - rollback + i, 4 - rollback + i, participants=1) for i in range(3 + rollback)]
    zero += [_step(9.0, 6, 7), _ev(10.0, event="end", digest="x", eval_loss=1.0, step=7)]
    one = [_step(s, s - 1, s) for s in range(1, 4)] + [_ev(3.5, event="kill", step=3, samples=16)]
    if heal:
        one += [_step(8.9, 0, 7, participants=1, used=False, attempt=1), _ev(8.95, event="healed", step=7)]
        one += [_ev(10.0, event="end", digest="x", eval_loss=1.0, step=7)]
    return {0: zero, 1: one}


def test_ft_figures_on_made_up_logs():
    m = recovery.ft_metrics(_ft_logs(), victim=1, batch_size=32)
    assert (m["steps_lost"], m["discarded"], m["heal_step"], m["heal_bitwise_equal"]) == (0, 1, 7, True)
    assert m["seconds_without_progress"] == pytest.approx(1.5)
    # trained: 3 full steps (96) + 3 survivor slices (48) + step 7's survivor slice (16)
    # lost (never trained): group 1's slices of the committed steps 4-7
    assert (m["samples_trained"], m["samples_lost"]) == (160, 4 * 16)
    # thrown away, counted apart: the discarded step (16), the victim's step in flight (16), its healing step (16)
    assert m["samples_thrown_away"] == 48


def test_ft_figures_could_come_out_otherwise():
    rolled = recovery.ft_metrics(_ft_logs(rollback=2), victim=1, batch_size=32)
    assert rolled["steps_lost"] == 2                                  # the survivor went back 2 steps
    lonely = recovery.ft_metrics(_ft_logs(heal=False), victim=1, batch_size=32)
    assert not lonely["heal_bitwise_equal"] and lonely["heal_step"] is None


def _restart_logs(late: float = 0.0) -> dict:
    """Rank 1 dies in the all-reduce after step 5; the snapshot is of step 4; attempt 1 redoes 5, 6.
    ``late``: rank 0 logs attempt 0's step 5 (and evaluates it) that much later than rank 1."""
    def steps(attempt, numbers, r):
        evs = []
        for s in numbers:
            t = s if attempt == 0 else 20 + s
            t += late if (r, attempt, s) == (0, 0, 5) else 0.0
            evs.append(_ev(t, event="step", attempt=attempt, step=s, samples=16, begun=t - 0.5))
            if r == 0:             # rank 0 evaluates after each step: attempt 1's models differ
                evs.append(_ev(t + 0.01, event="eval", step=s, eval_loss=10.0 - s - attempt / 2))
            if s == 4 and attempt == 0:
                evs.append(_ev(4.1, event="snapshot", step=4, seconds=0.01))
        return evs

    def rank(r):
        if r == 1:
            return steps(0, range(1, 6), r) + [_ev(5.5, event="kill", step=5, samples=32)] + steps(1, (5, 6), r)
        return (steps(0, range(1, 6), r) + [_ev(19.0, event="resume", attempt=1, step=4, seconds=0.01)]
                + steps(1, (5, 6), r) + [_ev(27.0, event="end", step=6, digest="y", eval_loss=3.5)])
    return {0: rank(0), 1: rank(1)}


def test_restart_figures_on_made_up_logs():
    m = recovery.restart_metrics(_restart_logs(), batch_size=32)
    assert (m["steps_lost"], m["resumed_from"], m["samples_lost"]) == (1, 4, 0)
    assert m["samples_trained"] == 6 * 32 and m["samples_thrown_away"] == 32 + 32   # step 5 once, in flight
    assert m["seconds_without_progress"] == pytest.approx(25.0 - 5.5)
    assert m["seconds_to_resume"] == pytest.approx(19.0 - 5.5)        # Daly's R: the snapshot read
    # the model held, from each step's commit: step 5 of attempt 0 until the kill, then the
    # snapshot's (step 4) until attempt 1 commits step 5 again
    held = [(e["step"], e["seconds"], e["eval_loss"]) for e in m["evals"]]
    assert held[3:] == [(4, 3.5, 6.0), (5, 4.5, 5.0), (4, 5.0, 6.0), (5, 24.5, 4.5), (6, 25.5, 3.5)], held
    assert recovery.loss_at_seconds(m["evals"], 5.0)["step"] == 4       # the kill's moment: rolled back
    assert recovery.loss_at_seconds(m["evals"], 24.5)["step"] == 5      # a commit's own moment: that step


def test_restart_holds_its_snapshot_from_the_kill_whichever_rank_logs_late():
    """Rank 0 logs (and evaluates) step 5 after rank 1 died in step 6: that evaluation is dated by
    the first commit of step 5 (before the kill), and from the kill to the redone step 5 the job
    holds the snapshot's step 4, the moment of every evaluation the same as ``commits``."""
    m = recovery.restart_metrics(_restart_logs(late=0.7), batch_size=32)
    kill, redo = m["kill_t"] - m["start_t"], m["commits"][5] - m["start_t"]
    between = [e for e in m["evals"] if kill <= e["seconds"] < redo]
    assert between and all(e["step"] == m["resumed_from"] for e in between), m["evals"]
    for step, t in m["commits"].items():
        if step > m["resumed_from"]:
            assert recovery.loss_at_seconds(m["evals"], t - m["start_t"])["step"] == step


def test_where_each_windows_seconds_went_on_made_up_logs():
    logs = _ft_logs()
    timed = {5.0: {"quorum_s": 1.2}, 6.0: {"quorum_s": 0.05}, 9.0: {"quorum_s": 0.1, "allreduce_s": 0.3}}
    logs[0] = [dict(e, **timed.get(e["t"], {})) if e.get("event") == "step" else e for e in logs[0]]
    m = recovery.ft_metrics(logs, victim=1, batch_size=32)
    parts = recovery.ft_time_parts(m, logs, victim=1, until=7)       # the kill at 3.5 to step 7 at 9.0
    back = recovery.REJOIN
    # made-up steps begin 0.5 s before their commit: the rest of each interval is between steps
    # (after the discarded step at 3.6, lone steps at 5, 6, 7: 0.9, 0.5, 0.5; step 7 at 9.0: 1.5)
    # the heal step (7.0 -> 9.0) is a part of its own, whole: its waits and its time between steps in it
    assert parts == pytest.approx({recovery.DISCARDED: 0.1, recovery.QUORUM_ALONE: 1.25, recovery.HEAL: 2.0,
                                   back["quorum"]: 0.0, back["allreduce"]: 0.0, back["commit"]: 0.0,
                                   recovery.BETWEEN: 1.9, recovery.IN_STEPS: 5.5 - 0.1 - 1.25 - 2.0 - 1.9})
    pause = recovery.longest_pause(m, logs, victim=1, until=7)        # 7.0 -> 9.0, the heal step
    assert (pause["step"], pause["seconds"], pause["between"], pause["allreduce"]) == pytest.approx((7, 2.0, 1.5, 0.3))
    assert m["waits_per_step_s"] == {r: {"quorum": 0.0, "allreduce": 0.0, "commit": 0.0} for r in (0, 1)}   # none logged
    assert m["asked_last"] == {0: 0, 1: 0}                                                     # before the kill
    logs = _restart_logs()
    logs[1].insert(6, _ev(18.0, event="start", attempt=1))
    m = recovery.restart_metrics(logs, batch_size=32)
    relaunch, redo, new = recovery.restart_time_parts(m, logs, until=6).values()
    assert (relaunch, redo, new) == pytest.approx((18.0 - 5.5, 25.0 - 18.0, 26.0 - 25.0))


def test_each_groups_own_waits_and_the_window_split_into_the_failure_and_the_pace():
    logs = _ft_logs()
    asked_late = {1.0: 0.2, 2.0: 0.3, 3.0: 0.4}          # group 1 waits for group 0 to ask, each step
    logs[1] = [dict(e, quorum_s=asked_late[e["t"]]) if e.get("event") == "step" and e["t"] in asked_late else e
               for e in logs[1]]
    logs[0] = [dict(e, quorum_s=0.001) if e.get("event") == "step" and e["t"] <= 3.0 else e for e in logs[0]]
    waits = recovery.ft_metrics(logs, victim=1, batch_size=32)["waits_per_step_s"]
    assert (waits[0]["quorum"], waits[1]["quorum"]) == pytest.approx((0.001, 0.3))    # medians, per group
    window = {"seconds": 6.0, "samples_trained": 120,
              "parts": {recovery.DISCARDED: 0.5, recovery.QUORUM_ALONE: 2.5, recovery.BETWEEN: 3.0}}
    window.update(recovery.split_window(window, recovery.FAILURE_PARTS["torchft"], 3, recovery.LONGER_STEPS["torchft"]))
    assert (window["failure_s"], window["stepping_s"], window["pace_s"]) == pytest.approx((3.0, 3.0, 1.0))
    assert recovery.goodput_at_pace(window, 3, 1.0) == pytest.approx(window["samples_trained"] / window["seconds"])
    assert recovery.goodput_at_pace(window, 3, 0.5) == pytest.approx(120 / 4.5)      # only the steps go faster
    # a heal step of 1.5 s among 3 new steps: the other two take 0.75 s each, the heal's 0.75 s more is the failure's
    healed = {"seconds": 6.0, "samples_trained": 120,
              "parts": {recovery.DISCARDED: 0.5, recovery.QUORUM_ALONE: 2.5, recovery.HEAL: 1.5, recovery.BETWEEN: 1.5}}
    healed.update(recovery.split_window(healed, recovery.FAILURE_PARTS["torchft"], 3, recovery.LONGER_STEPS["torchft"]))
    assert (healed["failure_s"], healed["longer_steps_excess_s"], healed["pace_s"]) == pytest.approx((3.75, 0.75, 0.75))
    assert healed["failure_s"] + healed["stepping_s"] == pytest.approx(healed["seconds"])


def test_which_group_asked_for_the_quorum_last_is_read_from_the_log():
    logs = _ft_logs()
    asked = {(0, 1.0): 0.6, (1, 1.0): 0.7, (0, 2.0): 1.8, (1, 2.0): 1.6, (0, 3.0): 2.9, (1, 3.0): 2.5}
    logs = {r: [dict(e, asked_t=asked[(r, e["t"])]) if (r, e["t"]) in asked and e.get("event") == "step" else e
                for e in evs] for r, evs in logs.items()}
    # steps 1-3 before the kill: group 1 asked last in step 1, group 0 in steps 2 and 3; the
    # discarded step and the lone steps do not count
    assert recovery.ft_metrics(logs, victim=1, batch_size=32)["asked_last"] == {0: 2, 1: 1}


def test_the_lone_rounds_before_the_first_world_of_two_are_counted_per_agent():
    lines = {"A": ["restart_count=0", "group_world_size=1", "[default] Detected 1 new nodes from group_rank=0; "
                   "will restart worker group", "restart_count=0", "group_world_size=2", "restart_count=1",
                   "group_world_size=1"],
             "B": ["restart_count=0", "group_world_size=1", "group_world_size=1", "group_world_size=2"],
             "C": ["group_world_size=2"]}
    assert elastic.lone_start_rounds(lines) == {"A": 1, "B": 2}      # A's later world of 1 is the shrink
    assert elastic.lone_start_rounds({"A": ["group_world_size=2"], "B": ["group_world_size=2"]}) == {"A": 0, "B": 0}


def test_losses_at_equal_steps_and_time():
    evals = [{"seconds": 1.0, "step": 4, "eval_loss": 3.0}, {"seconds": 2.0, "step": 8, "eval_loss": 2.0},
             {"seconds": 9.0, "step": 8, "eval_loss": 2.5}]
    assert recovery.loss_at_seconds(evals, 5.0)["eval_loss"] == 2.0
    assert recovery.loss_at_step(evals, 8)["eval_loss"] == 2.5        # the latest one logged there


def test_summary_figures_of_the_corruption_drill_can_fail():
    good = {"faults": [{"fault": "state-once", "detected_rank": 1},
                       {"fault": "compute-once", "check": "gradient", "detected_rank": 0, "flip_rank": 0},
                       {"fault": "compute-small", "check": "none", "detected_rank": -1, "flip_rank": 2}]}
    assert compare.sdc_figures(good) == {"detected_rank": 1, "compute_fault_detected": 1, "small_fault_found": 0}
    seen_by_checksum = {"faults": [dict(good["faults"][1], check="checksum")]}
    assert compare.sdc_figures(seen_by_checksum)["compute_fault_detected"] == 0
    wrong_rank = {"faults": [dict(good["faults"][1], detected_rank=2)]}
    assert compare.sdc_figures(wrong_rank)["compute_fault_detected"] == 0
    small_seen = {"faults": [dict(good["faults"][2], check="gradient")]}
    assert compare.sdc_figures(small_seen)["small_fault_found"] == 1


def test_torchfts_ddp_hook_fails_where_waiting_on_manager_allreduce_records_the_error():
    pytest.importorskip("torchft")
    from source_code.resilience import ft_ddp_bug
    r = ft_ddp_bug.reproduce()
    assert r["direct_wait_returned"] is False and "Connection closed" in r["direct_error"]
    assert r["hook"] == "AssertionError" and r["hook_error_recorded"]


@pytest.mark.parametrize("main,argv,phrase", [
    (compare.main, ["--kill-at-step", "16", "--snapshot-every", "8"], "falls on a snapshot step"),
    (compare.main, ["--steps", "5", "--kill-at-step", "9"], "below --steps"),
    (compare.main, ["--batch-size", "31"], "does not split over"),
    (ft_run.main, ["--replicas", "1"], "live peer"),
    (ft_run.main, ["--replicas", "3"], "--batch-size 32 does not split over --replicas 3"),
    (sdc_drill.main, ["--world-size", "2"], "majority"),
    (health_drill.main, ["--every", "9", "--steps", "8"], "--every"),
    (health_drill.main, ["--slow-factor", "1"], "--slow-factor"),
    (young_daly.main, ["--snapshot-seconds", "-1"], "positive"),
    (elastic.main, ["--batch-size", "7"], "even"),
    (elastic.main, ["--kill-after", "48", "--samples", "56"], "no step for the world"),
    (elastic.main, ["--max-restarts", "0"], "--max-restarts"),
    (reshard_drill.main, ["--worlds", "2,5", "--steps", "3"], "divide"),
    (reshard_drill.main, ["--steps", "5,6"], "inside the epoch"),
    (reshard_drill.main, ["--worlds", "2,x"], "numbers separated by commas"),
    (reshard_drill.main, ["--steps", "5"], "one --steps value"),
])
def test_bad_flags_are_refused_in_one_line(main, argv, phrase):
    with pytest.raises(LaunchError) as err:
        main(argv)
    assert phrase in err.value.message and "\n" not in err.value.message


def test_a_snapshot_slower_than_the_time_between_failures_still_gets_an_interval(capsys):
    assert young_daly.main(["--snapshot-seconds", "100000", "--failures-per-day", "4"]) == 0
    out = capsys.readouterr().out
    assert "best_interval_s=" in out and "daly_higher_order_s=21600.0" in out     # Daly: tau = M


def test_a_per_rank_position_would_not_carry_over():
    """The negative control: the same global batches, split by rank, depend on the world size."""
    from source_code.resilience.reshard import EpochPosition
    three, two = EpochPosition(48, 12), EpochPosition(48, 12)
    assert three.next_indices(0, 3) != two.next_indices(0, 2)
    assert sorted(sum((EpochPosition(48, 12).next_indices(r, 3) for r in range(3)), [])) == \
        sorted(sum((EpochPosition(48, 12).next_indices(r, 2) for r in range(2)), []))


def test_a_per_rank_sampler_state_repeats_samples_when_the_world_shrinks_and_skips_when_it_grows():
    shrink = reshard_drill.naive_resume(240, 24, before=3, after=2, steps_before=4)
    grow = reshard_drill.naive_resume(240, 24, before=2, after=3, steps_before=4)
    # 96 samples done, 32 per old rank; each new rank skips only 32 of its 120 (2 ranks): 32 again
    assert (shrink["repeated"], shrink["skipped"]) == (32, 0), shrink
    # 96 done, 48 per old rank; each of 3 new ranks skips 48 of its 80: 48 samples never trained
    assert (grow["repeated"], grow["skipped"]) == (0, 48), grow


def test_elastic_history_counts_the_runs_history_not_the_undone_steps():
    """World 2 to sample 16, killed after computing step 24 (not saved), world 1 from 16 to 32."""
    def start(t, world, port, agent, attempt, at, rank=0):
        return {"t": t, "event": "start", "rank": rank, "world": world, "master_port": port,
                "agent": agent, "attempt": attempt, "resumed_at": at, "pid": t}

    def step(t, world, port, consumed, samples, rank=0):
        return {"t": t, "event": "step", "rank": rank, "world": world, "master_port": port,
                "consumed": consumed, "samples": samples}
    events = {"start": [start(0, 2, 5, 100, 0, 0), start(0.1, 2, 5, 200, 0, 0, rank=1), start(5, 1, 6, 100, 1, 16)],
              "step": [step(1, 2, 5, 8, [0, 1, 2, 3]), step(1, 2, 5, 8, [4, 5, 6, 7], rank=1),
                       step(2, 2, 5, 16, [8, 9, 10, 11]), step(2, 2, 5, 16, [12, 13, 14, 15], rank=1),
                       step(3, 2, 5, 24, [16, 17, 18, 19]),
                       step(6, 1, 6, 24, list(range(16, 24))), step(7, 1, 6, 32, list(range(24, 32)))],
              "end": [{"t": 8, "event": "end", "eval_loss": 0.5}]}
    r = elastic_history.summarise(events, samples=32, batch_size=8)
    assert [w["size"] for w in r["worlds"]] == [2, 1] and r["worlds"][0]["restarts"] == {100: 0, 200: 0}
    assert r["worlds"][1]["restarts"] == {100: 1} and r["worlds"][1]["resumed_at"] == 16
    assert (r["seen"], r["unique"], r["expected"], r["recomputed"]) == (32, 32, 32, 4), r


def test_elastic_history_cli_names_a_nodes_processes_and_fails_without_exactly_once(tmp_path, capsys):
    import json
    rows = [{"t": 0, "event": "start", "rank": 0, "world": 1, "master_port": 5, "agent": 10, "pid": 11,
             "host": "n2", "attempt": 0, "resumed_at": 0},
            {"t": 1, "event": "step", "rank": 0, "world": 1, "master_port": 5, "consumed": 8, "samples": list(range(8))},
            {"t": 2, "event": "end", "samples": 16, "batch_size": 8, "eval_loss": 1.0}]
    (tmp_path / "worker_11.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert elastic_history.main([str(tmp_path), "--pids-on", "n2"]) == 0
    assert capsys.readouterr().out.split() == ["10", "11"]
    assert elastic_history.main([str(tmp_path)]) == 1           # 8 of the epoch's 16 samples
    assert "seen=8 unique=8 expected=16 exactly_once=0" in capsys.readouterr().out


def test_recovery_cli_fails_without_a_heal(tmp_path, capsys):
    import json
    for r, evs in _ft_logs(heal=False).items():
        (tmp_path / f"replica_{r}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evs))
    assert recovery.main([str(tmp_path), "--victim", "1"]) == 1
    assert "heal_bitwise_equal=0" in capsys.readouterr().out
    for r, evs in _ft_logs().items():
        (tmp_path / f"replica_{r}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evs))
    assert recovery.main([str(tmp_path), "--victim", "1"]) == 0
    assert "ft_steps_lost=0 ft_discarded_steps=1" in capsys.readouterr().out


def test_the_heal_steps_moments_are_read_from_the_logs():
    logs = _ft_logs()
    back = next(e for e in logs[1] if e.get("event") == "step" and e["attempt"] == 1)
    peer = next(e for e in logs[0] if e.get("event") == "step" and e["step"] == 7)
    back["received_t"], peer["allreduce_done_t"], peer["commit_begun_t"] = 8.5, 8.7, 8.8
    m = recovery.ft_metrics(logs, victim=1, batch_size=32)
    assert m["heal_order"] == {"received": 8.5, "allreduce_done": 8.7, "commit_begun": 8.8}
    # a log without the moments gives None, so that no order can be read from it
    assert set(recovery.ft_metrics(_ft_logs(), victim=1, batch_size=32)["heal_order"].values()) == {None}
