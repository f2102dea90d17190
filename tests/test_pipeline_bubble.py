"""bubble.py without processes: the holds of its three runs, its flag checks, and its table on
timelines the simulator made.

The measurement itself (torchrun, three runs x 2 schedules x m = 1, 2, 4, 8, 32 layers, about
20 s) runs once, in notebook 10 under nbval, whose cells assert what a test here would: every
held bubble (each m's least disturbed step) within 0.08 of (p - 1) / (m + p - 1) and shrinking
as m grows, the same hold on
every stage, the simulator's prediction at or above the formula, the slow run above the
formula and within 0.06 of the simulator's bubble with its own per-stage costs, each beside what
operations running past their hold added (the replay's count), and every measured step's bubble
within 0.08 of its replay.
"""
import statistics

import pytest

from source_code.pipeline import bubble
from source_code.pipeline.formulas import bubble_theory


def test_run_holds():
    hold = {"F": 0.01, "B": 0.02}
    got = bubble.run_holds(["raw", "held", "slow"], hold, 3, slow_stage=1, slow_factor=1.5)
    assert got["raw"] == [None] * 3 and got["held"] == [hold] * 3
    assert got["slow"][0] == got["slow"][2] == hold and got["slow"][1] == {"F": 0.015, "B": 0.03, "scale": 1.5}


@pytest.mark.parametrize("args, message", [
    (["--runs", "held,fast"], "--runs"), (["--runs", "raw,raw"], "--runs"),
    (["--hold", "0", "--runs", "raw,held"], "--runs raw or --hold 0"), (["--hold", "0.5"], "need a factor"),
    (["--slow-factor", "0"], "--slow-factor"),
])
def test_bad_flags_are_refused(args, message):
    from source_code.distributed import LaunchError
    with pytest.raises(LaunchError, match=message):
        bubble.main(args)


def test_table_on_simulated_timelines():
    """bubble.costs and bubble.table on timelines the simulator made: equal stages give the
    formula, a stage 1.5 x slower gives the simulator's bubble, above the formula."""
    from source_code.pipeline import simulator as sim

    def result(fwd, bwd):
        out = {}
        for name in bubble.SCHEDULES:
            for m in (1, 2, 4, 8):
                tl = [vars(op) | {} for op in sim.simulate(sim.orders(name, 2, m), fwd, bwd)]
                out.setdefault(name, {})[m] = {"bubbles": [sim.bubble_fraction(tl)], "step_s": [1.0],
                                               "timeline": tl, "all": [tl]}
        return out
    equal = result(0.01, 0.02)
    cost = bubble.costs(equal, 2)
    assert cost["F"] == [0.01, 0.01] and cost["comm"] == pytest.approx(0) and cost["gap"] == pytest.approx(0)
    lines, worst, sims = bubble.table(equal, 2, cost, "held")
    assert worst == pytest.approx(0, abs=1e-9) and len(lines) == 8 and lines[0].startswith("held  gpipe")
    slow = result([0.01, 0.015], [0.02, 0.03])
    lines, worst, sims = bubble.table(slow, 2, bubble.costs(slow, 2), "slow")
    for name in bubble.SCHEDULES:
        for m in (2, 4, 8):
            assert sims[name][m] == pytest.approx(statistics.median(slow[name][m]["bubbles"]))
            assert sims[name][m] > bubble_theory(2, m) + 0.03


def test_replay_counts_what_an_overrun_adds():
    """A held step where one forward ran 3 x past its hold: the replay with that step's own
    durations gives its bubble exactly, and the overrun's share is what it adds to the formula."""
    from source_code.pipeline import simulator as sim
    hold = {"F": [0.01, 0.01], "B": [0.02, 0.02]}
    late = {("F", 0, 2): 0.03}                     # stage 0's third forward: its core was taken
    out = {}
    for name in bubble.SCHEDULES:
        for m in (4, 8):
            tl = [vars(op) | {} for op in sim.simulate(sim.orders(name, 2, m), hold["F"], hold["B"], durations=late)]
            out.setdefault(name, {})[m] = {"bubbles": [sim.bubble_fraction(tl)], "step_s": [1.0], "all": [tl]}
    cost = bubble.costs(out, 2, keep=True)
    got = bubble.replay(out, 2, {**cost, "comm": 0.0, "gap": 0.0}, hold)
    for name in bubble.SCHEDULES:
        for m in (4, 8):
            (measured,) = out[name][m]["bubbles"]
            assert got[name][m]["replayed"] == [pytest.approx(measured)]
            assert measured > bubble_theory(2, m) + 0.01                      # the overrun added idle time
            assert got[name][m]["overrun"] == [pytest.approx(measured - bubble_theory(2, m))]
