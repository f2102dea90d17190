"""The capstone's entry point: flags refused in one line before any work, and its summary line.

    .venv/bin/python -m pytest tests/test_capstone.py -q

The notebook (nbval) runs the whole matrix; here a subset of configurations keeps the
processes short, with the uneven-token case that every run starts with.
"""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from source_code.capstone import matrix
from source_code.errors import LaunchError

ROOT = __file__.rsplit("/tests/", 1)[0]


@pytest.mark.parametrize("argv, words", [
    (["--batch-size", "12"], "multiple of 8"),
    (["--steps", "0"], "positive integer"),
    (["--configs", "DDP", "ZeRO-3"], "unknown configuration 'ZeRO-3'"),
    (["--lr", "-1"], "positive number"),
])
def test_bad_flags_refused_in_one_line(argv, words):
    with pytest.raises(LaunchError) as err:
        matrix.main(argv)
    assert words in err.value.message and "\n" not in err.value.message, err.value.message


def test_summary_line_of_a_subset():
    out = subprocess.run([sys.executable, "-m", "source_code.capstone.matrix", "--steps", "2",
                          "--configs", "DDP", "TP (own)", "PP x DP"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    last = out.stdout.strip().splitlines()[-1]
    m = re.fullmatch(r"summary: configs=(\d+) max_loss_diff=(\S+) uneven_tokens_grad_diff_fixed=(\S+) "
                     r"uneven_tokens_grad_diff_naive=(\S+)", last)
    assert m, f"unexpected last line: {last!r}"
    configs, loss, fixed, naive = int(m[1]), *map(float, m.groups()[1:])
    assert configs == 3, last
    assert loss <= 1e-5, f"a configuration's loss left the one-process curve: {last}"
    assert fixed <= 1e-6, f"the fixed normalisation is not exact: {last}"
    assert naive >= 1e-3, f"the per-rank mean did not visibly fail: {last}"


@pytest.mark.parametrize("sizes, words", [
    (dict(world=4, dp=3), "not the world size 4"),
    (dict(world=3, tp=3), "heads do not divide among tp=3"),
    (dict(world=3, pp=3), "layers do not divide into pp=3"),
    (dict(world=3, ep=3), "experts do not divide among ep=3"),
    (dict(world=3, cp=3), "2 x cp = 6"),
    (dict(world=4, tp=2, pp=2), "ONE other kind"),
    (dict(world=4, dp=2, tp=2), "--zero 3"),
    (dict(world=4, dp=4, zero=4), "use 0 (DDP)"),
    (dict(world=4, dp=2, pp=2, batch_size=12), "does not split into 8 pieces"),
])
def test_impossible_configurations_refused_in_one_line(sizes, words):
    from source_code.capstone import choose
    with pytest.raises(LaunchError) as err:
        choose.plan(**sizes)
    assert words in err.value.message and "\n" not in err.value.message, err.value.message


def test_possible_configurations_named():
    from source_code.capstone import choose
    assert choose.plan(4, dp=2, tp=2, zero=3) == "DTensor TP on 2 x FSDP2 on 2"
    assert choose.plan(2, pp=2) == "1F1B pipeline on 2"
    assert choose.plan(4, dp=4, zero=2) == "ZeRO-2 on 4"


def test_choose_entry_point_refuses_before_starting_processes():
    from source_code.capstone import choose
    with pytest.raises(LaunchError) as err:
        choose.main(["--world", "4", "--dp", "2", "--cp", "3"])
    assert "not the world size 4" in err.value.message
