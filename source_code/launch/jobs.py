"""Submit a Slurm job and wait for it without `sbatch --wait` (used by the tests and notebook 06).

    python -m source_code.launch.jobs slurm/ddp_multinode.slurm --epochs 1   # submit, wait, print

``sbatch --wait`` polls with a back-off that grows to 32 s (a 2 s job can return after 40 s);
here squeue/scontrol are asked every 0.5 s. A job still running (or pending for a reason other
than the jobs ahead of it) after ``timeout`` is cancelled (a job asking for more nodes than exist
would otherwise pend forever); waiting behind other jobs is not counted, up to ``queue_limit``.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# states of a job that has not ended (SIGNALING: a --signal is being delivered, e.g. the warning a
# requeued run gets at its start)
WAITING = ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "REQUEUE_FED", "RESIZING",
           "SUSPENDED", "SIGNALING", "STAGE_OUT")


@dataclass
class Job:
    id: str
    state: str
    exit_code: str
    output: str
    seconds: float
    restarts: int = 0  # runs after the first (a requeued job keeps its id)

    @property
    def ok(self) -> bool:
        return self.state == "COMPLETED"


def cluster_ready() -> bool:
    """True when the workshop's own test cluster (local_test_cluster) runs here: sinfo answers
    and reports at least one node up (idle, mixed or allocated). A site's Slurm is never ready
    in this sense: the notebooks' demonstration jobs are not for a site's queue."""
    if not shutil.which("sinfo") or not local_test_cluster():
        return False
    res = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], capture_output=True, text=True, timeout=20)
    return res.returncode == 0 and any(s in ("idle", "mix", "alloc") for s in res.stdout.split())


def job_info(job_id: str) -> dict:
    text = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
    return dict(re.findall(r"(\w+)=(\S*)", text))


# reasons a pending job waits for other jobs to leave the nodes (or for its requeue delay): the
# time spent so is the queue's, not the job's, and is not counted against its timeout
QUEUED_BEHIND_OTHERS = ("Resources", "Priority", "None", "BeginTime", "Dependency")


def wait(job_id: str, timeout: float = 120, queue_limit: float = 1800) -> dict:
    """Poll every 0.5 s until the job has left the queue; scancel it on timeout.

    ``timeout`` counts the job's own time: time pending behind other jobs (a busy cluster, the
    other pytest worker's jobs) is not counted, up to ``queue_limit`` seconds in all."""
    t0, counted, last, unanswered = time.time(), 0.0, time.time(), 0
    while counted < timeout and time.time() - t0 < queue_limit:
        info = job_info(job_id)
        now = time.time()
        if "JobState" not in info:  # scontrol timed out (a busy controller, e.g. during a requeue)
            unanswered += 1
            if unanswered > 60:
                raise RuntimeError(f"scontrol show job {job_id} has not answered for 30 s")
        elif info["JobState"] not in WAITING:
            return info
        else:
            unanswered = 0
            queued = info["JobState"] == "PENDING" and info.get("Reason") in QUEUED_BEHIND_OTHERS
            counted += 0 if queued else now - last
        last = now
        time.sleep(0.5)
    subprocess.run(["scancel", job_id], capture_output=True)
    state = job_info(job_id).get("JobState")
    raise TimeoutError(f"job {job_id} still {state} after {counted:.0f} s of its own time "
                       f"({time.time() - t0:.0f} s since submission); cancelled")


# the first line of the slurm.conf that tests/slurm_cluster.py (make cluster-up) writes
LOCAL_CLUSTER_MARK = "# written by tests/slurm_cluster.py"


def local_test_cluster() -> bool:
    """Is the Slurm configured here the workshop's own two-node test cluster (site ``local``)?"""
    conf = Path(os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf"))
    try:
        return conf.read_text().startswith(LOCAL_CLUSTER_MARK)
    except OSError:
        return False


def submit_shell(**extra) -> dict:
    """The environment of a shell that submits from here, before any site step: no SBATCH_* or
    WORKSHOP_SITE variables, this Python's folder first on PATH, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SBATCH_", "WORKSHOP_SITE"))}
    return {**env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}", **extra}


def sbatch(script, *args, sbatch_args=(), env=None, cwd=None) -> str:
    """Submit; return the job id. A refusal raises CalledProcessError carrying sbatch's message."""
    res = subprocess.run(["sbatch", "--parsable", *map(str, sbatch_args), str(script), *map(str, args)],
                         capture_output=True, text=True, env=env, cwd=cwd)
    if res.returncode != 0:
        raise subprocess.CalledProcessError(res.returncode, res.args, res.stdout, res.stderr)
    return res.stdout.strip().split(";")[0]


def run_job(script, *args, sbatch_args=(), env=None, cwd=None, timeout: float = 120) -> Job:
    """sbatch + wait + read the output file."""
    t0 = time.time()
    job_id = sbatch(script, *args, sbatch_args=sbatch_args, env=env, cwd=cwd)
    info = wait(job_id, timeout)
    out = Path(info.get("StdOut", ""))
    output = out.read_text() if info.get("StdOut") and out.is_file() else ""
    return Job(job_id, info.get("JobState", "?"), info.get("ExitCode", "?"), output, time.time() - t0,
               int(info.get("Restarts", 0) or 0))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        raise SystemExit("usage: python -m source_code.launch.jobs SCRIPT [ARGS...]")
    job = run_job(argv[0], *argv[1:], timeout=3600)
    print(job.output, end="")
    print(f"job {job.id}: {job.state} (exit {job.exit_code}) in {job.seconds:.1f} s")
    return 0 if job.ok else 1


if __name__ == "__main__":
    from source_code.errors import run_main   # a LaunchError: its one line, exit status 2
    run_main(main)
