"""2D parallelism on the local two-node Slurm cluster: TP inside a node, FSDP2 across nodes.

The job itself (notebook 12's `sbatch slurm/tp_dp_2d.slurm`: the mesh dp=2 x tp=2, one tp group
on each node, the summary and its loss) is submitted by tests/test_sbatch_lines.py, which checks
those lines; this file submits what that line cannot show: a TP that would span nodes."""
import pytest

from source_code.launch import site_profiles

pytestmark = pytest.mark.slurm


def test_tp_that_would_span_nodes_is_refused(submit):
    job = submit("tp_dp_2d.slurm", env={"TP": "4"}, sbatch_args=site_profiles.args("local", 4))
    assert not job.ok
    assert "error: TP=4 does not divide the 2 processes per node" in job.output
