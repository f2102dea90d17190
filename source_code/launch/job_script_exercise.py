"""Notebook 06's exercise: turn a one-node job script into a two-node one, checked for real.

    from source_code.launch.job_script_exercise import TEMPLATE, check_job_script
    check_job_script(my_script)             # reads it; submits it when a Slurm cluster runs

The learner starts from ``TEMPLATE``: one node, one torchrun with a private (--standalone)
rendezvous. The check reads the script first (the mistakes that cost a queue wait are found
in a second), then, when a Slurm cluster answers (the local test cluster, or a real one),
submits it with the sync check as the training module and reads what the ranks report: 4
processes on 2 nodes whose weights agree. Solution: ``source_code/solutions/nb06_launching.py``.
"""
from __future__ import annotations

import os
import re
import shlex
import sys
import tempfile
from pathlib import Path

from source_code.launch import jobs, site_profiles, sync_check

ROOT = Path(__file__).resolve().parents[2]

TEMPLATE = """#!/bin/bash
#SBATCH --job-name=my-ddp
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=2
#SBATCH --time=00:05:00

cd "$WORKSHOP_ROOT"                              # the repository (exported before sbatch)
export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK   # srun steps get all the task's cores
export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MASTER_PORT=$(( 20000 + SLURM_JOB_ID % 10000 ))

torchrun --standalone --nproc-per-node=2 -m source_code.launch.sync_check
"""

SECRETS = ("--account", "-A ", "--reservation", "--qos")


def sbatch_options(script: str) -> dict:
    """{option: value} of the #SBATCH lines (-N n is --nodes=n)."""
    opts = {}
    for line in script.splitlines():
        if not line.startswith("#SBATCH"):
            continue
        for word in shlex.split(line[len("#SBATCH"):], comments=True):
            key, _, value = word.partition("=")
            opts[{"-N": "--nodes", "-n": "--ntasks"}.get(key, key)] = value
    return opts


def read_problems(script: str) -> list[str]:
    """What is wrong with the script, found by reading it (empty list: nothing)."""
    opts = sbatch_options(script)
    joined = script.replace("\\\n", " ")  # continuation lines into one
    launch = " ".join(ln.strip() for ln in joined.splitlines()
                      if re.search(r"\btorchrun\b", ln) and not ln.lstrip().startswith("#"))
    problems = []
    if opts.get("--nodes") != "2":
        problems.append(f"the job asks for {opts.get('--nodes', 'one')} node(s): ask for 2 (#SBATCH --nodes=2)")
    if opts.get("--ntasks-per-node", "1") != "1":
        problems.append("one task per node: torchrun starts the node's processes itself "
                        f"(--ntasks-per-node={opts['--ntasks-per-node']} starts that many torchruns per node)")
    if any(s in script for s in SECRETS):
        problems.append("no account, reservation or QOS in a shared script: export SBATCH_ACCOUNT=<project> instead")
    if not launch:
        problems.append("no torchrun line")
        return problems
    if not re.search(r"\bsrun\b", launch):
        problems.append("the batch script runs on the first node only: start torchrun with srun, one per node")
    if "--standalone" in launch:
        problems.append("--standalone gives each node a private rendezvous (two jobs of 2 instead of one of 4): "
                        "use --rdzv-backend=c10d --rdzv-endpoint=$MASTER_ADDR:$MASTER_PORT --rdzv-id=$SLURM_JOB_ID")
    elif "--rdzv-endpoint" not in launch:
        problems.append("the torchruns must meet: --rdzv-backend=c10d --rdzv-endpoint=$MASTER_ADDR:$MASTER_PORT")
    if not re.search(r"--nnodes[= ]", launch):
        problems.append("tell torchrun how many nodes take part: --nnodes=$SLURM_JOB_NUM_NODES")
    return problems


def submit(script: str, timeout: float = 180) -> jobs.Job:
    """Submit the script to the running cluster (local site profile) and wait for it."""
    logs = Path(tempfile.mkdtemp(prefix="job-exercise-"))
    path = logs / "my_job.slurm"
    path.write_text(script)
    env = {**os.environ, "WORKSHOP_ROOT": str(ROOT), "WORKSHOP_SITE": "local",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    partition = site_profiles.args("local", 4)[:1] if "--partition" not in script else []
    return jobs.run_job(path, env=env, cwd=ROOT, timeout=timeout,
                        sbatch_args=[*partition, "-o", f"{logs}/%x-%j.out"])


def run_problems(job: jobs.Job) -> list[str]:
    """What the ranks of a finished job report, against 4 processes on 2 nodes in sync."""
    if not job.ok:
        return [f"job {job.id} ended {job.state} (exit {job.exit_code}); its output ends with:\n"
                + "\n".join(job.output.splitlines()[-8:])]
    try:
        res = sync_check.parse(job.output)
    except (IndexError, ValueError):
        return ["no 'sync:' line in the output: did the script run the sync check?"]
    problems = []
    if (res["world_size"], res["nodes"]) != (4, 2):
        problems.append(f"the ranks report world_size={res['world_size']} on {res['nodes']} node(s): "
                        "want one job of 4 processes on 2 nodes")
    if not res["in_sync"]:
        problems.append("the replicas' weights differ after training")
    return problems


def check_job_script(script: str, submit_if_possible: bool = True) -> str:
    if "TODO" in script or script.strip() == TEMPLATE.strip():
        raise NotImplementedError("exercise not done yet: edit the script, then run this cell again")
    problems = read_problems(script)
    if problems:
        raise AssertionError("not yet:\n* " + "\n* ".join(problems))
    if not (submit_if_possible and jobs.cluster_ready()):
        return ("the script reads right; no Slurm cluster answers here, so it was not submitted "
                "(start the local one: make cluster-up, as root)")
    job = submit(script)
    problems = run_problems(job)
    if problems:
        raise AssertionError(f"job {job.id} ran, but:\n* " + "\n* ".join(problems))
    res = sync_check.parse(job.output)
    return (f"correct: job {job.id} ran {res['world_size']} processes on {res['nodes']} nodes in "
            f"{job.seconds:.0f} s, replicas in sync (max_abs_diff={res['max_abs_diff']:.1e})")
