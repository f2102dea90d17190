"""The all-reduce benchmark: its table, busbw convention, ratio line, crossover helpers."""
import json
import subprocess
import sys

import pytest

from source_code.errors import run_main
from source_code.sync import allreduce_benchmark as bench, same_moments


def test_sizes_parse_and_bad_sizes_say_how(capsys):
    assert bench.parse_size("64MiB") == 64 * 2**20 and bench.parse_size("4096") == 4096
    with pytest.raises(SystemExit) as exit_:  # run_main(main): what `python -m` runs, refused while parsing
        run_main(lambda: bench.main(["--max-size", "64MB"]))
    assert exit_.value.code == 2 and "64KiB or 64MiB" in capsys.readouterr().err


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
    assert any(ln.startswith("# ring faster than parameter_server from: ") for ln in lines)
    ratio = float(lines[-1].split("=")[1])
    summary = json.loads(out.read_text())
    assert ratio == pytest.approx(summary["ratio"], abs=1e-3) and ratio > 0
    rows = [ln for ln in lines if ln.strip().endswith(tuple("0123456789")) and "|" in ln]
    assert [r.split()[0] for r in rows] == ["4KiB", "16KiB", "64KiB", "256KiB"]
    for name, table_rows in summary["rows"].items():
        for r in table_rows:  # busbw = algbw * 2 (n-1)/n with n = 3
            assert r["busbw"] == pytest.approx(r["algbw"] * 4 / 3)
            assert r["algbw"] == pytest.approx(r["size"] / (r["time_us"] * 1e-6) / 1e9)
    assert set(summary["rows"]) == {"ring", "naive_ring", "parameter_server", "library"}
    assert all(f["beta_Bps"] > 0 for f in summary["fits"].values())  # beta is a bandwidth in bytes/s
    pairs = summary["same_moments"]   # the server and the ring at 4 KiB and 256 KiB, 8 repetitions
    assert {s: len(t) for s, t in pairs["ring"].items()} == {str(4 * 2**10): 8, str(256 * 2**10): 8}
    assert same_moments.growth(pairs) > 0
    assert (tmp_path / "b.png").stat().st_size > 0


def test_crossover_helpers_on_a_made_up_summary():
    sizes = [2**k for k in (12, 14, 16, 18, 20)]
    rows = {"parameter_server": [{"size": s, "time_us": 100 + s / 1e3} for s in sizes],
            "ring": [{"size": s, "time_us": 300 + s / 2e3} for s in sizes]}
    summary = {"rows": rows, "fits": {"parameter_server": {"alpha_s": 100e-6, "beta_Bps": 1e9},
                                      "ring": {"alpha_s": 300e-6, "beta_Bps": 2e9}}}
    # the lines meet at 400 kB; the ring wins from 2**20 on, loses at 2**18
    assert bench.predicted_crossover(summary) == pytest.approx(4e5)
    assert bench.measured_crossover(summary) == pytest.approx(2**19)
    # paired ratios: each repetition's two calls divided, then the median (the ratio size's extra
    # repetitions of the ring have no partner and are left out)
    summary["times"] = {"parameter_server": {s: [1.0, 2.0, 9.0] for s in sizes},
                        "ring": {s: [2.0, 1.0, 3.0, 5.0, 5.0] if s == sizes[-1] else [2.0, 1.0, 3.0] for s in sizes}}
    assert bench.paired_ratios(summary) == {s: 2.0 for s in sizes}
    # the same two at two sizes in the same moments: each one's fastest call, a disturbed call
    # (9.0, 5.0) cannot tip it; the server / ring ratio grows from 1 at 4 KiB to 4 at 16 MiB
    pairs = {"parameter_server": {2**12: [1.0, 9.0, 2.0], 2**24: [8.0, 4.0, 5.0]},
             "ring": {2**12: [1.0, 1.0, 5.0], 2**24: [1.0, 2.0, 1.0]}}
    assert same_moments.ratios(pairs) == {2**12: 1.0, 2**24: 4.0} and same_moments.growth(pairs) == 4.0
    # the fit and the measurements agree, or say differently where the crossover is
    assert bench.crossovers_agree(4e5, 2**19, sizes[-1])
    assert not bench.crossovers_agree(4e5, 2**23, 2**24)                # 20 x apart
    assert bench.crossovers_agree(None, None, sizes[-1])              # no crossover, either way
    assert bench.crossovers_agree(2**21, None, sizes[-1])             # beyond the measured sizes
    assert not bench.crossovers_agree(2**14, None, sizes[-1])         # the fit says it is well inside
    assert not bench.crossovers_agree(None, 2**15, sizes[-1])         # measured well inside, not fitted
    assert bench.crossovers_agree(None, 2**19, sizes[-1])             # both at the edge or past it
    assert not bench.crossovers_agree(2**14, 2**19, sizes[-1])        # 32 x apart
