"""slurm/frameworks_train.slurm submitted to the local two-node Slurm cluster (fixtures in conftest.py):
Lightning started by srun (one task per process, Lightning's SLURMEnvironment), DeepSpeed ZeRO-3
with one torchrun per node on both nodes, Accelerate with torchrun on one node."""
from __future__ import annotations

import pytest

from source_code.launch import site_profiles
from source_code.training.loop import parse_summary

pytestmark = pytest.mark.slurm
SHORT = ["--epochs", "1", "--max-steps", "4"]


def summary(output: str) -> dict:
    return parse_summary(output[output.rindex("summary:"):])


def test_lightning_started_by_srun_one_task_per_process(submit):
    job = submit("frameworks_train.slurm", *SHORT, env={"FRAMEWORK": "lightning", "LAUNCHER": "srun"},
                 sbatch_args=["--ntasks-per-node=2", "--cpus-per-task=1"])
    assert job.ok, job.output
    assert "world_size=2 (1 node(s) x 2), launched by srun" in job.output
    assert summary(job.output)["world_size"] == 2 and "terminate called" not in job.output


def test_deepspeed_zero3_across_both_nodes(submit):
    job = submit("frameworks_train.slurm", *SHORT, "--zero-stage", "3", env={"FRAMEWORK": "deepspeed"},
                 sbatch_args=site_profiles.args("local", 4))
    assert job.ok, job.output
    assert "rendezvous c10d at n1:" in job.output and "deepspeed ZeRO-3" in job.output
    assert summary(job.output)["world_size"] == 4


def test_accelerate_on_one_node_with_torchrun(submit):
    job = submit("frameworks_train.slurm", *SHORT, env={"FRAMEWORK": "accelerate"})
    assert job.ok, job.output
    assert "accelerate (MULTI_CPU)" in job.output and summary(job.output)["world_size"] == 2
