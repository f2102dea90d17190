"""The measured pipeline bubble matches (p - 1) / (m + p - 1) within 10 % for p = 2, m = 1, 2, 4, 8."""
import re

import pytest


@pytest.mark.parity
@pytest.mark.slow
def test_bubble_matches_formula_p2(torchrun):
    out = torchrun("source_code.pipeline.bubble", "--steps", "5", nproc=2).stdout
    rows = re.findall(r"^(gpipe|1f1b)\s+(\d+)\s+(\S+)\s+(\S+)\s+(\S+)", out, re.M)
    assert len(rows) == 8, out  # 2 schedules x m = 1, 2, 4, 8
    E = float(re.search(r"^bubble_max_rel_error=(\S+)$", out, re.M)[1])
    assert E <= 0.10, out
