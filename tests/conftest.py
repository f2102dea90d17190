"""Shared test plumbing: the repository root, a torchrun runner, the PATH with the venv, and the
local Slurm cluster (session fixture `cluster`, started on first use and stopped at the end;
`submit(script, *args, env=..., sbatch_args=...)` runs a job of slurm/ and waits for it)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import slurm_cluster  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "slurm"
# scripts started by the tests (torchrun, sbatch jobs) must find the venv's executables
os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
# one intra-op thread for in-process tests: on 2 cores, two threads spin against the worker
# processes the multi-process tests start
torch.set_num_threads(1)


@pytest.fixture
def root() -> Path:
    return ROOT


@pytest.fixture
def torchrun():
    """torchrun(module, *args, nproc=2, check=True) -> CompletedProcess (stdout+stderr merged)."""
    from source_code.processes import torchrun as run
    return run


def _unavailable(reason: str):
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"local Slurm cluster could not start in CI: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def cluster():
    reason = slurm_cluster.why_not_possible()
    if reason:
        _unavailable(reason)
    try:
        base = slurm_cluster.start()
    except (slurm_cluster.ClusterUnavailable, subprocess.CalledProcessError) as err:
        _unavailable(f"local Slurm cluster did not start: {err}")
    yield base
    slurm_cluster.stop(base)


@pytest.fixture
def submit(cluster, tmp_path):
    """submit(script, *args, env={...}, sbatch_args=[...]) -> Job, output in tmp_path."""
    def run(script, *args, env=None, sbatch_args=(), timeout=150):
        full_env = {**os.environ, "WORKSHOP_SITE": "local", **(env or {})}
        job = slurm_cluster.run_job(SCRIPTS / script, *args, env=full_env, cwd=ROOT,
                                    sbatch_args=["-o", f"{tmp_path}/%x-%j.out", *sbatch_args],
                                    timeout=timeout)
        print(f"job {job.id} {script}: {job.state} in {job.seconds:.1f} s\n{job.output[-3000:]}")
        return job
    return run


# --------------------------------------------------------------- where the suite's time went
NOTEBOOK_BUDGET_S = 120  # design.md: every notebook under 2 minutes on 2 CPU cores
_durations: dict[str, float] = {}


def pytest_runtest_logreport(report):
    _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    """A short table at the end of every run: seconds by file, the ten slowest tests, and each
    notebook's time beside the 2 minutes it is meant to take (a report, not a timed test)."""
    if not _durations:
        return
    by_file: dict[str, float] = {}
    for nodeid, seconds in _durations.items():
        path = nodeid.split("::")[0]
        by_file[path] = by_file.get(path, 0.0) + seconds
    tr = terminalreporter
    tr.section("where the time went")
    tr.write_line(f"{sum(by_file.values()):8.1f} s in all, {len(_durations)} tests")
    for path, seconds in sorted(by_file.items(), key=lambda kv: -kv[1])[:15]:
        budget = ""
        if path.endswith(".ipynb"):
            budget = f"   (stated: under {NOTEBOOK_BUDGET_S} s{'; OVER' if seconds > NOTEBOOK_BUDGET_S else ''})"
        tr.write_line(f"{seconds:8.1f} s  {path}{budget}")
    tr.write_line("slowest tests:")
    for nodeid, seconds in sorted(_durations.items(), key=lambda kv: -kv[1])[:10]:
        tr.write_line(f"{seconds:8.1f} s  {nodeid}")
