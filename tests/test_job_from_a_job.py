"""A job submitted from inside another Slurm job, as from the terminal of a JupyterLab that runs as
a job: the submitting shell carries that job's SLURM_MEM_PER_CPU and SLURM_MEM_PER_NODE, sbatch
passes them on, and srun inside the new job would refuse every step beside its own
SLURM_MEM_PER_GPU ("... are mutually exclusive"). Submitted for real to the local cluster after
the site step (local-gpu: memory per GPU), with a lab job's variables in the environment. The
job is the single-node script's torchrun of two ranks, checked as any such job: every rank
reports, and the ranks stay in sync with one process."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import slurm_cluster  # noqa: E402

from source_code.launch import sync_check  # noqa: E402

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
           "TRAIN_MODULE": "source_code.launch.sync_check"}
    job = slurm_cluster.run_job(ROOT / "slurm" / "ddp_single_node.slurm", env=env, cwd=ROOT,
                                sbatch_args=["-o", f"{tmp_path}/%x-%j.out"], timeout=150)
    print(job.output[-3000:])
    assert "mutually exclusive" not in job.output, job.output
    assert job.ok, job.output
    assert "SLURM_MEM_PER_CPU=1000 came from the shell this job was submitted from" in job.output
    assert "SLURM_MEM_PER_NODE=2000 came from" in job.output and "GPU(s) per node" in job.output
    # the single-node script's torchrun: every rank reports, on one node, and DDP on the shards
    # equals one process on the whole batch
    found = sorted(re.findall(r"rank (\d+)/(\d+) local_rank=\d+ node=(\S+) launcher=(\S+)", job.output))
    assert [(r, w, la) for r, w, _, la in found] == [("0", "2", "torchrun"), ("1", "2", "torchrun")], job.output
    assert len({node for _, _, node, _ in found}) == 1, job.output
    res = sync_check.parse(job.output)
    assert (res["world_size"], res["nodes"], res["in_sync"]) == (2, 1, True) and res["max_abs_diff"] < 1e-6
