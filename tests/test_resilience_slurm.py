"""Notebook 17's torchft job on the local two-node Slurm cluster: one replica group per node, the
second killed in its all-reduce, started again and healed from the first (a few seconds of
training)."""
import re

import pytest

pytestmark = pytest.mark.slurm


def test_torchft_survives_a_node_and_heals_it_across_two_nodes(submit):
    pytest.importorskip("torchft")
    job = submit("resilience_torchft.slurm")
    assert job.ok, job.output
    assert re.search(r"lighthouse http://n1:\d+; groups on n1 and n2", job.output), job.output
    assert "replica 1: killed in the all-reduce of step 7" in job.output
    assert re.search(r"replica 1: back at step \d+, state received from a live peer", job.output)
    summary = dict(re.findall(r"(\w+)=(\S+)", job.output.strip().splitlines()[-1]))
    assert summary["groups"] == "2" and summary["ft_steps_lost"] == "0", summary
    assert int(summary["ft_discarded_steps"]) >= 1 and summary["heal_bitwise_equal"] == "1", summary


def test_a_job_with_one_node_is_refused_in_one_line(submit):
    job = submit("resilience_torchft.slurm", sbatch_args=["--nodes=1"])
    assert not job.ok
    assert "error: this job needs 2 nodes (sbatch --nodes=2), it has 1" in job.output
