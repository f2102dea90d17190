"""Notebook 06's job-script exercise: read checks for typical mistakes, and the reference
solution (and a wrong script) submitted for real to the local Slurm cluster."""
from __future__ import annotations

import pytest

from source_code.launch import job_script_exercise as ex
from source_code.solutions.nb06_launching import SCRIPT

WRONG = {
    "one node": (ex.TEMPLATE.replace("torchrun --standalone", "srun torchrun --standalone"), "ask for 2"),
    "no srun": (SCRIPT.replace("srun torchrun", "torchrun"), "first node only"),
    "standalone": (SCRIPT.replace('--rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT"',
                                  "--standalone"), "private rendezvous"),
    "two tasks per node": (SCRIPT.replace("--ntasks-per-node=1", "--ntasks-per-node=2"), "one task per node"),
    "no nnodes": (SCRIPT.replace('--nnodes="$SLURM_JOB_NUM_NODES" ', ""), "--nnodes"),
    "an account": (SCRIPT.replace("#SBATCH --time", "#SBATCH --account=project_2001234\n#SBATCH --time"),
                   "SBATCH_ACCOUNT"),
}


def test_the_reference_solution_reads_right():
    assert ex.read_problems(SCRIPT) == []
    assert ex.sbatch_options(SCRIPT)["--nodes"] == "2"


@pytest.mark.parametrize("name", list(WRONG))
def test_typical_mistakes_are_named_before_anything_is_submitted(name):
    script, words = WRONG[name]
    with pytest.raises(AssertionError, match="not yet") as err:
        ex.check_job_script(script, submit_if_possible=False)
    assert words in str(err.value)


def test_the_untouched_template_is_not_an_answer():
    with pytest.raises(NotImplementedError, match="not done yet"):
        ex.check_job_script(ex.TEMPLATE)


@pytest.mark.slurm
def test_the_solution_runs_four_processes_on_two_nodes_in_sync(cluster):
    assert ex.check_job_script(SCRIPT).startswith("correct: job")


def test_what_the_ranks_report_is_read_against_four_processes_on_two_nodes():
    # the output of a job whose nodes each ran a private rendezvous: two jobs of 2
    out = "sync: world_size=2 nodes=1 steps=5 in_sync=True max_abs_diff=1e-08\n" * 2
    problems = ex.run_problems(ex.jobs.Job("7", "COMPLETED", "0:0", out, 3.0))
    assert problems and "world_size=2 on 1 node(s)" in problems[0]
    failed = ex.run_problems(ex.jobs.Job("8", "FAILED", "1:0", "a\nb\nerror: x", 3.0))
    assert failed and "ended FAILED" in failed[0] and "error: x" in failed[0]
    good = "sync: world_size=4 nodes=2 steps=5 in_sync=True max_abs_diff=1e-08"
    assert ex.run_problems(ex.jobs.Job("9", "COMPLETED", "0:0", good, 3.0)) == []
