"""The measured pipeline bubble follows (p - 1) / (m + p - 1) for p = 2, m = 1, 2, 4, 8 when the
stages are held equal, and does not when one stage is slower (the simulator does).

Checked on the JSON the module writes: every held bubble lies within 0.08 of the formula (the
formula's steps between these m are 0.17, 0.13 and 0.09, so a wrong schedule or a wrong idle
count fails) and shrinks as m grows; every held operation lasted its fixed duration and the
hold is the same on both stages; the simulator's prediction with the measured message and
gap costs lies at or above the formula (they only add idle time). In the slow run stage 1
holds 1.5 x as long: its bubble lies above the formula and within 0.05 of the simulator's
with the run's per-stage costs. The raw run (no hold) is notebook 09's; here two runs at
fewer layers keep the test short. The goal E <= 0.10 holds on quiet cores at the defaults,
so here E is only bounded loosely: E < 0.5 (a busy machine gave 0.36 once).
"""
import json
import statistics

import pytest

from source_code.pipeline import bubble
from source_code.pipeline.formulas import bubble_theory


@pytest.mark.parity
@pytest.mark.slow
def test_bubble_held_and_slow_stage_p2(torchrun, tmp_path):
    out = tmp_path / "bubble.json"
    run = torchrun("source_code.pipeline.bubble", "--layers", "64", "--runs", "held,slow",
                   "--out", out, nproc=2)
    rep = json.loads(out.read_text())
    assert rep["p"] == 2 and list(rep["runs"]) == ["held", "slow"], run.stdout
    held, slow = rep["runs"]["held"], rep["runs"]["slow"]
    assert held["holds"][0] == held["holds"][1] == rep["hold"]
    assert 0 < rep["hold"]["F"] < rep["hold"]["B"]       # a backward costs more than a forward
    assert slow["holds"][1]["B"] == pytest.approx(1.5 * rep["hold"]["B"]) and slow["holds"][0] == rep["hold"]
    for name in ("gpipe", "1f1b"):
        med = {int(m): statistics.median(v["bubbles"]) for m, v in held["result"][name].items()}
        assert sorted(med) == [1, 2, 4, 8]
        for m, value in med.items():
            assert abs(value - bubble_theory(2, m)) <= 0.08, (name, m, value, run.stdout)
            assert held["sim"][name][str(m)] >= bubble_theory(2, m) - 1e-3, (name, m)
        assert [med[m] for m in (1, 2, 4, 8)] == sorted(med.values(), reverse=True), (name, med)
        for m in (2, 4, 8):
            value = statistics.median(slow["result"][name][str(m)]["bubbles"])
            assert value > bubble_theory(2, m) + 0.02, (name, m, value)
            assert abs(value - slow["sim"][name][str(m)]) < 0.05, (name, m, value, slow["sim"][name])
    assert held["max_rel_error"] < 0.5, run.stdout
    assert run.stdout.strip().splitlines()[-1] == f"bubble_max_rel_error={held['max_rel_error']:.4f}"


def test_run_holds():
    hold = {"F": 0.01, "B": 0.02}
    got = bubble.run_holds(["raw", "held", "slow"], hold, 3, slow_stage=1, slow_factor=1.5)
    assert got["raw"] == [None] * 3 and got["held"] == [hold] * 3
    assert got["slow"][0] == got["slow"][2] == hold and got["slow"][1] == {"F": 0.015, "B": 0.03}


@pytest.mark.parametrize("args, message", [
    (["--runs", "held,fast"], "--runs"), (["--runs", "raw,raw"], "--runs"),
    (["--hold", "0"], "--runs raw"), (["--slow-factor", "0"], "--slow-factor"),
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
