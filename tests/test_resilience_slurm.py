"""Notebook 17's torchft job on the local two-node Slurm cluster, given one node: refused in one line.

The job as the notebook prints it (one replica group per node, the second killed in its
all-reduce, started again and healed from the first) runs in tests/test_sbatch_lines.py, which
reads its output: the kill, the heal from a live peer and the summary's counts."""
import pytest

pytestmark = pytest.mark.slurm


def test_a_job_with_one_node_is_refused_in_one_line(submit):
    job = submit("resilience_torchft.slurm", sbatch_args=["--nodes=1"])
    assert not job.ok
    assert "error: this job needs 2 nodes (sbatch --nodes=2), it has 1" in job.output
