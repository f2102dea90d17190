"""Notebook 06's exercise: one launcher per node, each told its own node rank.

    from source_code.launch.srun_exercise import check_srun_line
    check_srun_line(my_line)      # one line of a job script: prints 'right', or one line why not

The line must start one task on every node of the job, and each task must print
``torchrun --node-rank=R --nnodes=N`` with R that node's ``SLURM_NODEID`` and N the job's
number of nodes (``echo`` stands in for the launcher, so the check can run it). The check runs
the line as a batch script would (``srun_quoting.in_job_script``: real bash, srun pretended) in
jobs of 2, 3 and 5 nodes with 4 tasks a node asked for in the #SBATCH lines, with the task count
of the sites' Slurm (23.02.5 and newer). A line right there but not on Slurm 22.05 (the local test
cluster's: ``-N`` with ``--ntasks-per-node`` and no ``-n``) is right, with one more line saying
what 22.05 does with it. Solution: ``source_code/solutions/nb06_srun.py``.
"""
from __future__ import annotations

import re

from source_code.errors import LaunchError
from source_code.launch.srun_quoting import LOCAL_SLURM, in_job_script

NODES = (2, 3, 5)
TASKS_PER_NODE = 4       # the job's #SBATCH --ntasks-per-node: one torchrun a node needs fewer
PRINTED = re.compile(r"^torchrun --node-rank=(\S*) --nnodes=(\S*)$")


def problem(line: str, slurm: tuple[int, ...] | None = None) -> str:
    """'' when ``line`` is right, else one line saying what went wrong (on the sites' Slurm, or the
    version ``slurm``)."""
    if "srun" not in line.split():
        return "the line does not start anything with srun: the batch script runs on the first node only"
    for nodes in NODES:
        try:
            printed = (in_job_script(line, nodes, TASKS_PER_NODE) if slurm is None
                       else in_job_script(line, nodes, TASKS_PER_NODE, slurm=slurm))
        except LaunchError as err:
            return err.message
        if not printed:
            return "the tasks printed nothing: each must echo its torchrun line"
        literal = next((p for p in printed if "$" in p), None)
        if literal:
            return (f"a task printed {literal.strip()!r}: the variable reached the task as text, "
                    "and no shell there expanded it")
        parsed = [PRINTED.match(p.strip()) for p in printed]
        if not all(parsed):
            odd = next(p for p, m in zip(printed, parsed) if not m)
            return f"a task printed {odd.strip()!r}, not 'torchrun --node-rank=R --nnodes=N'"
        ranks = [m.group(1) for m in parsed]
        counts = {m.group(2) for m in parsed}
        if len(printed) != nodes:
            why = (f"{len(printed)} tasks started on {nodes} nodes: one launcher a node, "
                   f"whatever the job's {TASKS_PER_NODE} tasks a node")
            if "--ntasks-per-node" in line:   # Slurm's own warning, which srun writes to stderr
                why += ("; srun warned that it cannot honor --ntasks-per-node, which is smaller than "
                        "the step's task count in all (the job's, unless the line says otherwise)")
            return why
        if counts != {str(nodes)}:
            return f"on {nodes} nodes the tasks printed --nnodes={', '.join(sorted(counts))}"
        if len(set(ranks)) == 1:
            return (f"on {nodes} nodes every task printed --node-rank={ranks[0]}: the value of the batch "
                    "shell on the first node, read before srun started any task")
        if sorted(ranks) != [str(i) for i in range(nodes)]:
            return f"on {nodes} nodes the node ranks were {', '.join(ranks)}, not 0..{nodes - 1}"
    return ""


def older_slurm(line: str) -> str:
    """'' when a line right on the sites' Slurm is right on 22.05 too, else what 22.05 does."""
    why = problem(line, slurm=LOCAL_SLURM)
    if not why:
        return ""
    return ("on Slurm before 23.02.5 (the local test cluster runs 22.05) the same line fails: " + why
            + "; there the step's task count must be on the line (-n)")


def check_srun_line(line: str) -> None:
    """Print one line: right, or what went wrong (never a traceback); a right line that older
    Slurm runs otherwise gets a second line saying so. ``problem`` returns what went wrong."""
    why = problem(line)
    if why:
        print(f"not yet: {why}")
        return
    print("right: every node got its own node rank, on 2, 3 and 5 nodes (the sites' Slurm)")
    older = older_slurm(line)
    if older:
        print(f"note: {older}")
