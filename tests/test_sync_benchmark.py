"""The all-reduce benchmark: its table, busbw convention, ratio line and alpha-beta fit."""
import json
import subprocess
import sys

import numpy as np
import pytest

from source_code.sync import allreduce_benchmark as bench


def test_fit_recovers_a_known_alpha_beta():
    sizes = np.array([2**k for k in range(10, 27, 2)], dtype=float)
    alpha, beta = 50e-6, 1 / 2e9
    times = (alpha + beta * sizes) * (1 + 0.01 * np.cos(np.arange(len(sizes))))  # 1% wiggle
    a, b = bench.fit_alpha_beta(sizes, times)
    assert a == pytest.approx(alpha, rel=0.1)
    assert b == pytest.approx(beta, rel=0.05)


def test_sizes_parse_and_bad_sizes_say_how():
    assert bench.parse_size("64MiB") == 64 * 2**20 and bench.parse_size("4096") == 4096
    res = subprocess.run([sys.executable, "-m", "source_code.sync.allreduce_benchmark", "--max-size", "64MB"],
                         capture_output=True, text=True)
    assert res.returncode == 2 and "64KiB or 64MiB" in res.stderr


@pytest.mark.slow
def test_benchmark_prints_table_and_ratio(tmp_path):
    out = tmp_path / "bench.json"
    res = subprocess.run([sys.executable, "-m", "source_code.sync.allreduce_benchmark", "--world-size", "3",
                          "--min-size", "4KiB", "--max-size", "256KiB", "--ratio-size", "256KiB",
                          "--budget", "1MiB", "--json", str(out), "--plot", str(tmp_path / "b.png")],
                         capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stderr[-2000:]
    lines = res.stdout.splitlines()
    assert lines[-1].startswith("ring_vs_library_busbw_ratio=")
    ratio = float(lines[-1].split("=")[1])
    summary = json.loads(out.read_text())
    assert ratio == pytest.approx(summary["ratio"], abs=1e-3) and ratio > 0
    rows = [ln for ln in lines if ln.strip().endswith(tuple("0123456789")) and "|" in ln]
    assert [r.split()[0] for r in rows] == ["4KiB", "16KiB", "64KiB", "256KiB"]
    for name, table_rows in summary["rows"].items():
        for r in table_rows:  # busbw = algbw * 2 (n-1)/n with n = 3
            assert r["busbw"] == pytest.approx(r["algbw"] * 4 / 3)
            assert r["algbw"] == pytest.approx(r["size"] / (r["time_us"] * 1e-6) / 1e9)
    assert set(summary["rows"]) == {"ring", "naive_ring", "param_server", "library"}
    assert (tmp_path / "b.png").stat().st_size > 0
