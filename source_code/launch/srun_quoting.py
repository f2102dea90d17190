"""`srun bash -c "... $SLURM_PROCID ..."`: who expands the variable, the batch shell or each task?

    python -m source_code.launch.srun_quoting 'srun bash -c "echo rank $SLURM_PROCID"' --tasks-per-node 3

A job script runs in one shell on the first node, where Slurm has set ``SLURM_PROCID=0`` (the
batch step is task 0). That shell expands ``$SLURM_PROCID`` inside double quotes *before* srun
starts the tasks, so every task receives the text ``echo rank 0``. Escaped (``\\$SLURM_PROCID``)
or in single quotes, the variable reaches each task's own ``bash -c`` and is expanded there, with
that task's value.

``in_job_script(line, tasks)`` runs ``line`` through a real bash, as a batch script would, with
``srun`` replaced by a function that starts its command once per task with that task's
``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NODEID`` and the step's ``SLURM_STEP_NUM_NODES``,
``SLURM_STEP_NUM_TASKS``, one after the other: the quoting is bash's own, only the
scheduler is pretended. ``on_cluster(line, tasks)`` runs the same line in a real job and sorts
its lines, since real tasks finish in any order.

The task count follows the Slurm version asked for (``slurm=``, default the sites' newer ones):
inside a batch job srun takes the job's ``SLURM_NTASKS`` as its ``-n``, and a
``--ntasks-per-node`` that does not fit it is ignored with a warning. Since Slurm 23.02.5
(SchedMD commit 5de93e6e24, bug 17108, in ``src/srun/opt.c``) a ``-N`` given on the line with a
``--ntasks-per-node`` sets the inherited count aside: ``srun -N 2 --ntasks-per-node=1`` starts
one task a node there, and the job's count, with the warning, before (the local test cluster's
22.05.8 did so in a job of 2 nodes x 2 tasks: 4 tasks).
"""
from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
from pathlib import Path

from source_code.cli import positive_int
from source_code.errors import LaunchError, run_main

# srun's options that take a separate value (the others are --flag or --option=value)
_WITH_VALUE = {"-c", "--cpus-per-task", "-o", "--output", "-J", "--job-name", "--jobid"}
# the task layout: --ntasks-per-node, -n/--ntasks and -N/--nodes are honoured as srun does in a
# batch job (the job's SLURM_NTASKS is its -n when none is given); tasks spread over the nodes in
# blocks, as evenly as they go (Slurm's default distribution), at least one a node
SITES_SLURM = (24, 5)          # LUMI runs 24.05; the check takes every site to be at 23.02.5 or newer
LOCAL_SLURM = (22, 5, 8)       # the workshop's local test cluster
NTASKS_RESET = (23, 2, 5)      # from here a -N on the line sets the job's SLURM_NTASKS aside
PRETEND_SRUN = r"""
srun() {
    local per_node=$TASKS_PER_NODE ntasks="" nodes=$SLURM_NNODES given_per_node="" given_nodes=""
    while [ $# -gt 0 ]; do
        case "$1" in
            --ntasks-per-node) per_node=$2; given_per_node=1; shift 2 ;;
            --ntasks-per-node=*) per_node=${1#--ntasks-per-node=}; given_per_node=1; shift ;;
            -n|--ntasks) ntasks=$2; shift 2 ;;
            -n*) ntasks=${1#-n}; shift ;;
            --ntasks=*) ntasks=${1#--ntasks=}; shift ;;
            -N|--nodes) nodes=$2; given_nodes=1; shift 2 ;;
            -N*) nodes=${1#-N}; given_nodes=1; shift ;;
            --nodes=*) nodes=${1#--nodes=}; given_nodes=1; shift ;;
            %s) shift 2 ;;
            -*) shift ;;
            *) break ;;
        esac
    done
    # in a batch job srun reads the job's SLURM_NTASKS as its -n, and ignores a --ntasks-per-node
    # that does not fit it (with Slurm's own warning); from 23.02.5 not where -N is on the line
    if [ -z "$ntasks" ] && [ -n "$given_per_node" ] && [ -n "$given_nodes" ] && [ -n "$NTASKS_RESET" ]; then
        ntasks=$((nodes * per_node))
    elif [ -z "$ntasks" ] && [ -n "$given_per_node" ] && (( ${SLURM_NTASKS:-0} != nodes * per_node )); then
        echo "srun: Warning: can't honor --ntasks-per-node set to $per_node which doesn't match the requested tasks $SLURM_NTASKS with the number of requested nodes $nodes. Ignoring --ntasks-per-node." >&2
        ntasks=$SLURM_NTASKS given_per_node=""
    fi
    if [ -n "$ntasks" ] && [ -z "$given_per_node" ]; then
        (( nodes > ntasks )) && nodes=$ntasks
    else
        ntasks=$((nodes * per_node))
    fi
    local i node task=0 here
    for ((node = 0; node < nodes; node++)); do
        here=$(( ntasks / nodes + (node < ntasks %% nodes ? 1 : 0) ))
        for ((i = 0; i < here; i++)); do
            ( export SLURM_PROCID=$task SLURM_LOCALID=$i SLURM_NODEID=$node \
                     SLURMD_NODENAME=n$((node + 1)) SLURM_STEP_NUM_TASKS=$ntasks \
                     SLURM_STEP_NUM_NODES=$nodes SLURM_STEP_TASKS_PER_NODE=$here; "$@" ) || return $?
            task=$((task + 1))
        done
    done
}
""" % "|".join(sorted(_WITH_VALUE))


def in_job_script(line: str, nodes: int = 1, tasks_per_node: int = 2,
                  slurm: tuple[int, ...] = SITES_SLURM) -> list[str]:
    """The lines ``line`` prints when the batch script of a job of ``nodes`` nodes with
    ``tasks_per_node`` tasks on each runs it (srun's own --ntasks-per-node, -n and -N are honoured,
    as the Slurm version ``slurm`` does: LOCAL_SLURM for the local test cluster's)."""
    if nodes < 1 or tasks_per_node < 1:
        raise LaunchError(f"error: nodes={nodes}, tasks_per_node={tasks_per_node}; both at least 1")
    reset = "1" if tuple(slurm) >= NTASKS_RESET else ""
    script = (PRETEND_SRUN + f"export NTASKS_RESET={reset} TASKS_PER_NODE={tasks_per_node} SLURM_NNODES={nodes} "
              f"SLURM_JOB_NUM_NODES={nodes} SLURM_NTASKS={nodes * tasks_per_node} SLURM_PROCID=0 "
              f"SLURM_NODEID=0 SLURM_LOCALID=0 SLURMD_NODENAME=n1 SLURM_JOB_ID=4242\n{line}\n")
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        last = re.sub(r"^bash: (-c: )?(line \d+: )?", "", last)
        raise LaunchError(f"error: the line failed in bash ({last}); check its quotes")
    return done.stdout.splitlines()


def on_cluster(line: str, nodes: int = 1, tasks_per_node: int = 2, timeout: float = 120) -> list[str]:
    """The same line in a real batch job on the local cluster (jobs.py). The tasks of a real step
    run at once and write in whichever order they finish, so the lines come back sorted."""
    from source_code.launch import jobs
    with tempfile.TemporaryDirectory(prefix="srun-quoting-") as tmp:
        script = Path(tmp) / "line.sh"
        script.write_text(f"#!/bin/bash\n{line}\n")
        job_id = jobs.sbatch(str(script), sbatch_args=[f"--nodes={nodes}", f"--ntasks-per-node={tasks_per_node}",
                                                       "-o", f"{tmp}/%j.out"])
        info = jobs.wait(job_id, timeout=timeout)
        out = Path(info.get("StdOut", ""))
        return sorted(out.read_text().splitlines()) if out.is_file() else []


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("line", help="a job-script line, e.g. 'srun bash -c \"echo $SLURM_PROCID\"'")
    p.add_argument("--nodes", type=positive_int, default=1)
    p.add_argument("--tasks-per-node", type=positive_int, default=2)
    args = p.parse_args(argv)
    printed = in_job_script(args.line, args.nodes, args.tasks_per_node)
    print(f"$ {args.line}    # in the job script of {args.nodes} node(s) x {args.tasks_per_node} task(s)")
    print("\n".join(printed))


if __name__ == "__main__":
    run_main(main)
