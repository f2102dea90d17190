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
    """torchrun(module, *args, nproc=2, check=True) -> CompletedProcess (stdout+stderr merged).
    Every launch that exits 0 must also have ended cleanly: torch + gloo can abort at exit
    ("terminate called without an active exception") after the work is done, which an exit
    status alone does not always show."""
    from source_code.processes import torchrun as run

    def checked(*args, **kw):
        res = run(*args, **kw)
        if res.returncode == 0 and res.stdout:
            assert "terminate called" not in res.stdout, res.stdout[-2000:]
        return res
    return checked


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
        base = slurm_cluster.acquire()
    except (slurm_cluster.ClusterUnavailable, subprocess.CalledProcessError) as err:
        _unavailable(f"local Slurm cluster did not start: {err}")
    yield base
    slurm_cluster.release(base)


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
