"""slurm/ddp_single_node_srun.slurm run as Slurm would run it on a node, with `srun` replaced by a
stand-in that prints its command line (no cluster needed): the step starts one task per GPU
Slurm gave the node, whatever the job's #SBATCH --ntasks-per-node says."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_script(tmp_path, expect=0, **slurm):
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "srun").write_text('#!/bin/bash\necho "step: srun $*"\n')
    (fake / "srun").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "WORKSHOP_", "SRUN_"))}
    env.update({"PATH": f"{fake}:{Path(sys.executable).parent}:{env.get('PATH', '')}", "PYTHON": sys.executable,
                "WORKSHOP_ROOT": str(ROOT), "MASTER_ADDR": "n1", "SLURM_JOB_ID": "42",
                "SLURM_JOB_NODELIST": "n1", "SLURM_JOB_NUM_NODES": "1", "SLURM_NTASKS_PER_NODE": "2",
                "SLURM_CPUS_PER_TASK": "1", **slurm})
    res = subprocess.run(["bash", str(ROOT / "slurm/ddp_single_node_srun.slurm")], cwd=tmp_path, env=env,
                         capture_output=True, text=True)
    assert res.returncode == expect, res.stderr
    if expect:
        return [], res.stdout + res.stderr
    step = next(ln for ln in res.stdout.splitlines() if ln.startswith("step: srun "))
    return step.split(), res.stdout


def test_one_task_per_gpu_of_the_allocation_with_its_share_of_the_cores(tmp_path):
    # LUMI after the site step: 8 GCDs, 56 cores on the node, the script's 2 tasks asked for
    step, out = run_script(tmp_path, WORKSHOP_SITE="local-gpu", SLURM_GPUS_ON_NODE="8", SLURM_CPUS_ON_NODE="56")
    assert "--ntasks-per-node=8" in step and "--ntasks=8" in step and "--cpus-per-task=7" in step, step
    assert "--overcommit" not in step and "tasks=8" in out and "idle" not in out, out


def test_fewer_cores_than_gpus_stop_in_one_line_naming_the_cores_to_ask_for(tmp_path):
    # a shared partition (Puhti after its site step) gives the script's 2 tasks x 1 core to 4 GPUs
    step, out = run_script(tmp_path, expect=2, WORKSHOP_SITE="puhti", SLURM_GPUS_ON_NODE="4",
                           SLURM_CPUS_ON_NODE="2")
    assert out.strip().splitlines() == [out.strip()] and "step: srun" not in out, out
    # Puhti's share is 10 cores a GPU: 2 tasks of 20 cores, the 40 that the 4 GPUs' tasks share out
    assert "job 42 has 2 CPU core(s) for 4 GPU(s) on this node" in out and "sbatch --cpus-per-task=20 " in out, out


def test_fewer_cores_than_gpus_run_on_shared_cores_only_on_the_cpu_on_purpose(tmp_path):
    step, out = run_script(tmp_path, WORKSHOP_SITE="local-gpu", SLURM_GPUS_ON_NODE="4", SLURM_CPUS_ON_NODE="2",
                           WORKSHOP_DEVICE="cpu")
    assert "--ntasks-per-node=4" in step and "--overcommit" in step and "--cpus-per-task=1" in step, step
    assert "WORKSHOP_DEVICE=cpu: the processes run on the CPU on purpose" in out, out


def test_the_cpu_cluster_runs_the_jobs_own_tasks(tmp_path):
    step, out = run_script(tmp_path, WORKSHOP_SITE="local", SLURM_CPUS_ON_NODE="2")
    assert not any(w.startswith(("--ntasks", "--cpus-per-task")) for w in step), step
    assert "tasks=2" in out, out
