"""Notebook 06's job-script exercise: read checks for typical mistakes, and the reference
solution (and a wrong script) submitted for real to the local Slurm cluster."""
from __future__ import annotations

import pytest

from source_code.launch import job_script_exercise as ex
from source_code.solutions.nb06_launching import SCRIPT

WRONG = {
    "one node": (ex.TEMPLATE.replace("torchrun --standalone", "srun torchrun --standalone"), "how many nodes the job gets"),
    "no srun": (SCRIPT.replace("srun torchrun", "torchrun"), "first node only"),
    "standalone": (SCRIPT.replace('--rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT"',
                                  "--standalone"), "private rendezvous"),
    "two tasks per node": (SCRIPT.replace("--ntasks-per-node=1", "--ntasks-per-node=2"), "one task per node"),
    "no nnodes": (SCRIPT.replace('--nnodes="$SLURM_JOB_NUM_NODES" ', ""), "how many nodes take part"),
    # a static rendezvous whose node rank the batch shell expands: 0 on every node
    "static, node rank of the batch shell": (
        SCRIPT.replace('--rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT" --rdzv-id="$SLURM_JOB_ID"',
                       '--master-addr="$MASTER_ADDR" --master-port="$MASTER_PORT" --node-rank=$SLURM_NODEID'),
        "which shell expands"),
    # the same inside a task's shell, but in double quotes: the batch shell still expands it
    "static, bash -c in double quotes": (
        SCRIPT.replace('srun torchrun --nnodes="$SLURM_JOB_NUM_NODES" --nproc-per-node=2 \\\n'
                       '    --rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT" --rdzv-id="$SLURM_JOB_ID" \\\n'
                       '    -m source_code.launch.sync_check',
                       'srun bash -c "torchrun --nnodes=$SLURM_JOB_NUM_NODES --nproc-per-node=2 --node-rank=$SLURM_NODEID '
                       '--master-addr=$MASTER_ADDR --master-port=$MASTER_PORT -m source_code.launch.sync_check"'),
        "which shell expands"),
    # an endpoint without a backend, told a node rank the batch shell expands: 0 on every node
    "endpoint, node rank of the batch shell": (
        SCRIPT.replace('--rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT"',
                       '--rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT" --node-rank=$SLURM_NODEID'),
        "which shell expands"),
    # an endpoint without a backend: torchrun's default (static) gives both nodes node rank 0
    "no rendezvous backend": (SCRIPT.replace("--rdzv-backend=c10d ", ""), "default rendezvous backend (static)"),
    "an account": (SCRIPT.replace("#SBATCH --time", "#SBATCH --account=project_2001234\n#SBATCH --time"),
                   "SBATCH_ACCOUNT"),
    # read right without a cluster too: the counts torchrun is given (a cluster would run 2 of 4)
    "one node in the rendezvous": (SCRIPT.replace('--nnodes="$SLURM_JOB_NUM_NODES"', "--nnodes=1"), "--nnodes=1:"),
    "one process a node": (SCRIPT.replace("--nproc-per-node=2", "--nproc-per-node=1"), "--nproc-per-node=1:"),
    "torchrun's default process count": (SCRIPT.replace("--nproc-per-node=2 ", ""), "torchrun default"),
}


# right answers written another way than the reference
RIGHT = {
    "--nodes 2 (space form)": SCRIPT.replace("--nodes=2", "--nodes 2"),
    "-N 2": SCRIPT.replace("--nodes=2", "-N 2"),
    "-N2": SCRIPT.replace("--nodes=2", "-N2"),
    "--rdzv_endpoint (underscores)": SCRIPT.replace("--rdzv-backend", "--rdzv_backend")
                                           .replace("--rdzv-endpoint", "--rdzv_endpoint").replace("--rdzv-id", "--rdzv_id"),
    "--rdzv-backend='c10d' (single quotes)": SCRIPT.replace("--rdzv-backend=c10d", "--rdzv-backend='c10d'"),
    "--rdzv-backend \"c10d\" (space form, double quotes)": SCRIPT.replace("--rdzv-backend=c10d", '--rdzv-backend "c10d"'),
    "--nnodes=2 typed, --nproc_per_node 2": SCRIPT.replace('--nnodes="$SLURM_JOB_NUM_NODES"', "--nnodes=2")
                                                  .replace("--nproc-per-node=2", "--nproc_per_node 2"),
    "--nnodes 2:2 (elastic form)": SCRIPT.replace(
        '--nnodes="$SLURM_JOB_NUM_NODES"', "--nnodes 2:2"),
    "static rendezvous, node rank from each task's shell": SCRIPT.replace(
        'srun torchrun --nnodes="$SLURM_JOB_NUM_NODES" --nproc-per-node=2 \\\n'
        '    --rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT" --rdzv-id="$SLURM_JOB_ID" \\\n'
        '    -m source_code.launch.sync_check',
        "srun bash -c 'torchrun --nnodes=$SLURM_JOB_NUM_NODES --nproc-per-node=2 --node-rank=$SLURM_NODEID "
        "--master-addr=$MASTER_ADDR --master-port=$MASTER_PORT -m source_code.launch.sync_check'"),
    "static rendezvous, the $ escaped in double quotes": SCRIPT.replace(
        'srun torchrun --nnodes="$SLURM_JOB_NUM_NODES" --nproc-per-node=2 \\\n'
        '    --rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT" --rdzv-id="$SLURM_JOB_ID" \\\n'
        '    -m source_code.launch.sync_check',
        'srun bash -c "torchrun --nnodes=$SLURM_JOB_NUM_NODES --nproc-per-node=2 --node-rank=\\$SLURM_NODEID '
        '--master-addr=$MASTER_ADDR --master-port=$MASTER_PORT -m source_code.launch.sync_check"'),
}


def test_the_reference_solution_reads_right():
    assert ex.read_problems(SCRIPT) == []
    assert ex.sbatch_options(SCRIPT)["--nodes"] == "2"


@pytest.mark.parametrize("name", list(RIGHT))
def test_right_answers_written_another_way_read_right(name):
    assert RIGHT[name] != SCRIPT, "the variant must differ from the reference"
    assert ex.read_problems(RIGHT[name]) == []


def test_the_messages_guide_without_giving_the_line():
    said = " ".join(p for script, _ in WRONG.values() for p in ex.read_problems(script))
    for answer in ("--nodes=2", "--rdzv-endpoint=", "--rdzv-backend=c10d", "--nnodes=$", "srun torchrun"):
        assert answer not in said, answer


@pytest.mark.parametrize("name", list(WRONG))
def test_typical_mistakes_are_named_before_anything_is_submitted(name):
    script, words = WRONG[name]
    with pytest.raises(AssertionError, match="not yet") as err:
        ex.check_job_script(script, submit_if_possible=False)
    assert words in str(err.value)


def test_the_untouched_template_is_not_an_answer():
    with pytest.raises(NotImplementedError, match="not done yet"):
        ex.check_job_script(ex.TEMPLATE)
    # the notebook's starting script: the template with TODO comments, still not an answer
    noted = ex.TEMPLATE.replace("#SBATCH --nodes=1", "#SBATCH --nodes=1                                # TODO: two nodes")
    with pytest.raises(NotImplementedError, match="not done yet"):
        ex.check_job_script(noted.replace("\ntorchrun", "\n# TODO: one torchrun per node\ntorchrun"))


def test_a_right_script_that_keeps_the_todo_comments_is_an_answer():
    noted = SCRIPT.replace("#SBATCH --nodes=2", "#SBATCH --nodes=2                                # TODO: two nodes")
    noted = noted.replace("\nsrun torchrun", "\n# TODO: one torchrun per node, all meeting in one rendezvous\nsrun torchrun")
    assert noted.count("TODO") == 2
    assert ex.check_job_script(noted, submit_if_possible=False).startswith(("correct", "the script reads right"))


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
