"""The profiling entry points on 2 real processes: profiler table and traces, throughput, hang drill."""
import json
import re
import subprocess
import sys

import pytest

from source_code.processes import rank_lines
from source_code.profiling import classify
from source_code.training.loop import parse_summary


@pytest.mark.parity
def test_profile_ddp_separates_communication_and_writes_traces(torchrun, tmp_path):
    out = torchrun("source_code.profiling.profile_ddp", "--trace-dir", tmp_path, "--out",
                   tmp_path / "result.json", "--active", 2, timeout=120).stdout
    s = parse_summary(out)
    assert s["world_size"] == 2 and s["comm_ms"] > 0 and s["compute_ms"] > 0, out
    result = json.loads((tmp_path / "result.json").read_text())
    kinds = {r["name"]: r["kind"] for r in result["rows"]}
    assert kinds.get("gloo:all_reduce") == "communication", kinds
    assert kinds.get("aten::convolution_backward") == "computation", kinds
    assert all(r["totals"]["communication"] > 0 and r["totals"]["computation"] > 0 for r in result["ranks"])
    for rank in (0, 1):
        path = tmp_path / f"rank{rank}.json"
        assert f"trace written to {path}" in out
        trace = json.loads(path.read_text())  # valid JSON
        spans = classify.intervals(trace)
        assert spans["computation"] and spans["communication"], rank
        assert len(classify.step_windows(trace)) == 2  # the active steps only


@pytest.mark.parity
def test_throughput_reports_samples_and_data_wait(torchrun):
    out = torchrun("source_code.profiling.throughput", "--global-batch", 32, "--steps", 4,
                   "--workers", 1, "--decode-rounds", 1, timeout=120).stdout
    s = parse_summary(out)
    assert s["world_size"] == 2 and s["per_rank_batch"] == 16 and s["workers"] == 1, out
    assert s["samples_per_s"] > 0 and 0 <= s["data_wait_share"] <= 1, out
    assert re.search(r"^step 4/4 ", out, re.M), out  # rank 0's progress, no bar (not a terminal)
    assert out.count("summary:") == 1 and "\r" not in out


@pytest.mark.parity
def test_hang_is_detected_within_the_timeout_and_named(torchrun, tmp_path):
    res = torchrun("source_code.profiling.hang", "--timeout", 3, "--trace-dir", tmp_path, timeout=120)
    out = rank_lines(res.stdout)
    s = parse_summary(out)
    assert res.returncode == 0 and s["hang_detected"] == 1, out
    # both ranks stop and say so; the first whose 3 s timeout fires names it, and the other one
    # then sees either its own timeout or the connection its peer closed (whichever comes first)
    stopped = {int(r): (float(t), msg) for r, t, msg in
               re.findall(r"\[rank (\d)\] stopped after (\S+) s \(\w+\): (.*)", out)}
    assert sorted(stopped) == [0, 1], out
    assert any("Timed out waiting 3000ms" in msg for _, msg in stopped.values()), out
    assert all("Timed out waiting 3000ms" in msg or "closed" in msg.lower() for _, msg in stopped.values()), out
    assert max(t for t, _ in stopped.values()) >= 3, out   # a wait cut short by the timeout
    # the flight recorders name the collective rank 1 never made
    assert s["mismatch_at"] == 6, out
    assert re.search(r"rank 0 ran #6 gloo:all_reduce \[1000\] Float; rank 1 ran #6 gloo:barrier", out), out


@pytest.mark.parity
def test_debug_detail_reports_the_mismatched_collectives(torchrun, tmp_path):
    res = torchrun("source_code.profiling.hang", "--timeout", 3, "--trace-dir", tmp_path, timeout=90,
                   env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    out = rank_lines(res.stdout)
    assert parse_summary(out)["hang_detected"] == 1, out
    assert "Detected mismatch between collectives" in out and "OpType=ALLREDUCE" in out, out
    assert "TensorShape=[1000]" in out and "TensorOptions" not in out, out


@pytest.mark.parity
def test_fixed_loop_runs_through(torchrun, tmp_path):
    out = torchrun("source_code.profiling.hang", "--fixed", "--timeout", 3, "--trace-dir", tmp_path,
                   timeout=90).stdout
    s = parse_summary(out)
    assert s["hang_detected"] == 0 and "rank 0 made 6 all-reduces" in out, out


def test_bad_flag_is_one_line():
    res = subprocess.run([sys.executable, "-m", "source_code.profiling.hang", "--timeout", "0"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and res.stderr.strip().startswith("error: argument --timeout: 0 is not")
