"""The measured pipeline bubble follows (p - 1) / (m + p - 1) for p = 2, m = 1, 2, 4, 8.

Checked: every measured bubble lies within 0.08 of the formula (the formula's steps between
these m are 0.17, 0.13 and 0.09, so a wrong schedule or a wrong idle count fails), the bubble
shrinks as m grows, every operation was held to its fixed duration, and the simulator's
prediction with the measured message and gap costs lies at or above the formula (they only add
idle time). Half the default layers keep the test short; the goal E <= 0.10 holds on quiet
cores at the defaults (on a busy 2-core machine, a message that lands while the other stage
computes costs CPU time), so here E is only bounded loosely: E < 0.5 (a busy machine gave
0.36 once).
"""
import re

import pytest

from source_code.pipeline.formulas import bubble_theory


@pytest.mark.parity
@pytest.mark.slow
def test_bubble_follows_the_formula_p2(torchrun):
    out = torchrun("source_code.pipeline.bubble", "--layers", "128", nproc=2).stdout
    rows = re.findall(r"^(gpipe|1f1b)\s+(\d+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)", out, re.M)
    assert len(rows) == 8, out  # 2 schedules x m = 1, 2, 4, 8
    measured = {(name, int(m)): float(meas) for name, m, _, meas, _, _ in rows}
    simulated = {(name, int(m)): float(sim) for name, m, _, _, _, sim in rows}
    for (name, m), value in measured.items():
        assert abs(value - bubble_theory(2, m)) <= 0.08, (name, m, value, out)
        assert simulated[(name, m)] >= bubble_theory(2, m) - 1e-3, (name, m, out)
    for name in ("gpipe", "1f1b"):
        series = [measured[(name, m)] for m in (1, 2, 4, 8)]
        assert series == sorted(series, reverse=True), (name, series, out)
    hold = re.search(r"^hold: every F lasts (\S+) ms, every B (\S+) ms", out, re.M)
    assert hold and 0 < float(hold[1]) < float(hold[2]), out  # a backward costs more than a forward
    E = float(re.search(r"^bubble_max_rel_error=(\S+)", out, re.M)[1])
    assert E < 0.5, out
