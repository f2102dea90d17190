"""A job submitted from inside another Slurm job, as from the terminal of a JupyterLab that runs as
a job: the submitting shell carries that job's SLURM_MEM_PER_CPU and SLURM_MEM_PER_NODE, sbatch
passes them on, and srun inside the new job would refuse every step beside its own
SLURM_MEM_PER_GPU ("... are mutually exclusive"). Submitted for real to the local cluster after
the site step (local-gpu: memory per GPU), with a lab job's variables in the environment."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import slurm_cluster  # noqa: E402

pytestmark = pytest.mark.slurm
ROOT = Path(__file__).resolve().parents[1]


def after_site_step() -> dict:
    cmd = (f'eval "$({shlex.quote(sys.executable)} -m source_code.launch.site_profiles --site local-gpu '
           '--format exports)" && env -0')
    res = subprocess.run(["bash", "-c", cmd], cwd=ROOT, capture_output=True, text=True, check=True)
    env = dict(kv.split("=", 1) for kv in res.stdout.split("\0") if "=" in kv)
    assert env.get("SBATCH_MEM_PER_GPU"), env          # the step asks for memory per GPU
    return env


def test_a_job_submitted_from_a_lab_jobs_terminal_runs(cluster, tmp_path):
    env = {**after_site_step(), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           # what a lab job's terminal has: its own memory request, per CPU and per node
           "SLURM_MEM_PER_CPU": "1000", "SLURM_MEM_PER_NODE": "2000",
           # the steps the job starts are what is refused or not, not the training in them
           "TRAIN_MODULE": "source_code.launch.whoami"}
    job = slurm_cluster.run_job(ROOT / "slurm" / "ddp_single_node.slurm", env=env, cwd=ROOT,
                                sbatch_args=["-o", f"{tmp_path}/%x-%j.out"], timeout=150)
    print(job.output[-3000:])
    assert "mutually exclusive" not in job.output, job.output
    assert job.ok, job.output
    assert "SLURM_MEM_PER_CPU=1000 came from the shell this job was submitted from" in job.output
    assert "SLURM_MEM_PER_NODE=2000 came from" in job.output and "GPU(s) per node" in job.output
