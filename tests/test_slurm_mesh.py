"""2D parallelism on the local two-node Slurm cluster: TP inside a node, FSDP2 across nodes."""
import re

import pytest

from source_code.launch import site_profiles
from source_code.training.loop import parse_summary

pytestmark = pytest.mark.slurm


def test_tp_dp_2d_keeps_tp_inside_each_node(submit):
    # 4 "GPUs" = 2 nodes x 2 processes: tp=2 (default: the processes of a node), dp=2 across nodes
    job = submit("tp_dp_2d.slurm", "--steps", "10", sbatch_args=site_profiles.args("local", 4))
    assert job.ok, job.output
    assert "mesh: dp=2 x tp=2, tp inside each of 2 nodes" in job.output
    groups = re.findall(r"tp group \[(\d+), (\d+)\] on (\S+)$", job.output, re.M)
    assert len(groups) == 2 and all("," not in host for *_, host in groups), job.output
    assert {host for *_, host in groups} == {"n1", "n2"}          # one tp group per node
    summary = parse_summary(job.output)
    assert summary["world_size"] == 4 and summary["dp"] == 2 and summary["tp"] == 2
    assert summary["steps"] == 10 and summary["loss"] < 3.0


def test_tp_that_would_span_nodes_is_refused(submit):
    job = submit("tp_dp_2d.slurm", env={"TP": "4"}, sbatch_args=site_profiles.args("local", 4))
    assert not job.ok
    assert "error: TP=4 does not divide the 2 processes per node" in job.output
