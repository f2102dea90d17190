"""Notebook 20's Slurm job refuses one node in one line, before any work.

The job itself (shards staged to each node's own directory, trained on 2 nodes and stopped
mid-epoch, resumed on 1 node, every sample once, or it fails) runs as the notebook prints it,
in tests/test_sbatch_lines.py; this file only submits what that line cannot show."""
import pytest

pytestmark = pytest.mark.slurm


def test_a_job_with_one_node_is_refused_in_one_line(submit):
    job = submit("data_at_scale.slurm", sbatch_args=["--nodes=1"])
    assert not job.ok
    assert "error: this job needs 2 nodes (sbatch --nodes=2), it has 1" in job.output
