"""Notebook 06's srun exercise: the reference passes, the typical wrong lines get their one line,
and the quoting lesson's bash runs what a batch script would (no cluster needed: srun pretended)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from source_code.launch.srun_exercise import check_srun_line, problem
from source_code.launch.srun_quoting import LOCAL_SLURM, in_job_script
from source_code.solutions.nb06_srun import LINE

WRONG = {
    # read by the batch shell: every node gets node rank 0
    'srun --ntasks=$SLURM_NNODES bash -c "echo torchrun --node-rank=$SLURM_NODEID --nnodes=$SLURM_NNODES"':
        "every task printed --node-rank=0",
    # one task per slot of the job, not one per node
    r'srun bash -c "echo torchrun --node-rank=\$SLURM_NODEID --nnodes=\$SLURM_NNODES"': "tasks started on",
    # --ntasks-per-node=1 alone: srun takes the job's SLURM_NTASKS as -n and ignores it (real Slurm does)
    r'srun --ntasks-per-node=1 bash -c "echo torchrun --node-rank=\$SLURM_NODEID --nnodes=\$SLURM_NNODES"':
        "srun warned that it cannot honor --ntasks-per-node",
    # no shell in the task: the variable arrives as text
    r"srun --ntasks=$SLURM_NNODES echo torchrun --node-rank='$SLURM_NODEID' --nnodes='$SLURM_NNODES'":
        "no shell there expanded it",
    # the node count typed in: right on 2 nodes only
    r'srun --ntasks=$SLURM_NNODES bash -c "echo torchrun --node-rank=\$SLURM_NODEID --nnodes=2"':
        "on 3 nodes the tasks printed --nnodes=2",
    # no srun: the batch script's one shell
    "echo torchrun --node-rank=$SLURM_NODEID --nnodes=$SLURM_NNODES": "does not start anything with srun",
    # a quote left open
    'srun --ntasks-per-node=1 bash -c "echo torchrun': "check its quotes",
}


def test_reference_and_its_single_quoted_form_pass(capsys):
    assert problem(LINE) == ""
    single = "srun --ntasks=$SLURM_NNODES bash -c 'echo torchrun --node-rank=$SLURM_NODEID --nnodes=$SLURM_NNODES'"
    assert problem(single) == ""
    # one task a node said by the task count: srun spreads them one a node
    for other in (r'srun --ntasks=$SLURM_NNODES bash -c "echo torchrun --node-rank=\$SLURM_NODEID --nnodes=\$SLURM_NNODES"',
                  r'srun -N $SLURM_NNODES -n $SLURM_NNODES bash -c "echo torchrun --node-rank=\$SLURM_NODEID '
                  r'--nnodes=\$SLURM_NNODES"',
                  "srun --nodes=$SLURM_NNODES --ntasks=$SLURM_NNODES bash -c "
                  "'echo torchrun --node-rank=$SLURM_NODEID --nnodes=$SLURM_NNODES'",
                  # the step's node count (srun sets it in every task), or the job's, the same everywhere
                  r'srun -n $SLURM_NNODES bash -c "echo torchrun --node-rank=\$SLURM_NODEID '
                  r'--nnodes=\$SLURM_STEP_NUM_NODES"',
                  r'srun --ntasks=$SLURM_NNODES bash -c "echo torchrun --node-rank=\$SLURM_NODEID '
                  r'--nnodes=$SLURM_JOB_NUM_NODES"'):
        assert problem(other) == "", other
    check_srun_line(LINE)
    out = capsys.readouterr().out
    assert out.startswith("right:") and out.count("\n") == 1      # right on 22.05 too: no note


# -N with --ntasks-per-node=1 and no -n: from Slurm 23.02.5 (SchedMD 5de93e6e24) a -N on the line
# sets the job's SLURM_NTASKS aside, one task a node; 22.05.8 (the local cluster, a job of 2 nodes
# x 2 tasks) warned "can't honor --ntasks-per-node" and started 4
NODES_AND_PER_NODE = r'srun -N "$SLURM_NNODES" --ntasks-per-node=1 bash -c "echo torchrun --node-rank=\$SLURM_NODEID --nnodes=\$SLURM_NNODES"'


def test_a_line_right_on_the_sites_slurm_only_is_right_and_says_what_22_05_does(capsys):
    assert problem(NODES_AND_PER_NODE) == ""
    assert "srun warned that it cannot honor --ntasks-per-node" in problem(NODES_AND_PER_NODE, slurm=LOCAL_SLURM)
    check_srun_line(NODES_AND_PER_NODE)
    right, note = capsys.readouterr().out.splitlines()
    assert right.startswith("right:") and note.startswith("note: on Slurm before 23.02.5")
    assert "tasks started on 2 nodes" in note and "Traceback" not in note


@pytest.mark.parametrize("line", list(WRONG))
def test_wrong_lines_get_one_line_that_says_what_went_wrong(line, capsys):
    assert WRONG[line] in problem(line)
    check_srun_line(line)
    out = capsys.readouterr().out
    assert out.startswith("not yet:") and out.count("\n") == 1 and "Traceback" not in out


def test_the_batch_shell_expands_double_quotes_before_the_tasks_start():
    assert in_job_script('srun bash -c "echo $SLURM_PROCID"', 1, 3) == ["0", "0", "0"]
    assert in_job_script(r'srun bash -c "echo \$SLURM_PROCID \$SLURM_LOCALID"', 2, 2) == \
        ["0 0", "1 1", "2 0", "3 1"]
    # -n and -N are honoured: tasks spread over the nodes in blocks, at least one a node
    assert in_job_script(r'srun -n 3 bash -c "echo \$SLURM_NODEID \$SLURM_LOCALID"', 2, 4) == ["0 0", "0 1", "1 0"]
    assert in_job_script(r'srun -N1 bash -c "echo \$SLURM_NODEID"', 2, 2) == ["0", "0"]
    # a -N on the line sets the job's task count aside from Slurm 23.02.5 on, not before (22.05.8 here)
    per_node = r'srun -N2 --ntasks-per-node=1 bash -c "echo \$SLURM_NODEID"'
    assert in_job_script(per_node, 2, 2) == ["0", "1"]
    assert in_job_script(per_node, 2, 2, slurm=LOCAL_SLURM) == ["0", "0", "1", "1"]
    assert in_job_script(per_node, 2, 2, slurm=(23, 2, 4)) == ["0", "0", "1", "1"]
    # --ntasks-per-node with the node count from the job (no -N on the line): ignored on every version
    alone = r'srun --ntasks-per-node=1 bash -c "echo \$SLURM_NODEID"'
    assert in_job_script(alone, 2, 2) == in_job_script(alone, 2, 2, slurm=LOCAL_SLURM) == ["0", "0", "1", "1"]


def test_the_command_line_refuses_bad_sizes_in_one_line():
    done = subprocess.run([sys.executable, "-m", "source_code.launch.srun_quoting", "echo", "--nodes", "0"],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "not a positive integer" in done.stderr and "Traceback" not in done.stderr
