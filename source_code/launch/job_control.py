"""What a participant does with a job once it is queued: look, look inside, stop, read the end.

    python -m source_code.launch.job_control JOBID     # its queue line and its processes

``squeue --me`` lists your jobs; ``srun --overlap --jobid JOBID ...`` runs a command inside a
running job's allocation, beside the job's own steps (``nvidia-smi`` or ``rocm-smi`` there says
whether every GPU works; on CPU nodes ``pgrep``/``top`` says which processes compute);
``scancel JOBID`` stops it; after the end ``sacct -j JOBID`` gives its state and time from the
site's accounting database (the local test cluster keeps none: ``scontrol show job`` gives the
same fields until the controller forgets the job, MinJobAge seconds later); ``srun --pty bash``
opens a shell on a compute node (it needs a terminal: ``script`` lends one here).
"""
from __future__ import annotations

import argparse
import subprocess
import time

from source_code.errors import LaunchError, run_main
from source_code.launch.jobs import QUEUED_BEHIND_OTHERS, job_info


def _run(cmd: list[str], timeout: float = 60) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise LaunchError(f"error: `{' '.join(cmd)}` failed: {(done.stderr or done.stdout).strip()[-300:]}")
    return done.stdout


def wait_running(job_id: str, timeout: float = 60, queue_limit: float = 1800) -> dict:
    """Poll until the job runs (its steps have started); its scontrol fields. ``timeout`` counts
    the job's own time: pending behind other jobs (a busy cluster) is not counted, up to
    ``queue_limit`` seconds in all, as jobs.wait counts it."""
    start = last = time.time()
    counted = 0.0
    while counted < timeout and time.time() - start < queue_limit:
        info = job_info(job_id)
        state = info.get("JobState")
        if state == "RUNNING":
            return info
        if state not in (None, "PENDING", "CONFIGURING"):
            raise LaunchError(f"error: job {job_id} is {state}, not running")
        now = time.time()
        counted += 0 if state == "PENDING" and info.get("Reason") in QUEUED_BEHIND_OTHERS else now - last
        last = now
        time.sleep(0.5)
    raise LaunchError(f"error: job {job_id} did not start within {timeout:.0f} s (squeue --me says why)")


def queue_line(job_id: str) -> str:
    """The job's line in ``squeue --me``: id, name, state, time, nodes, node list."""
    return _run(["squeue", "--me", "--noheader", "-j", job_id, "-o", "%i %j %T %M %D %N"]).strip()


def inside(job_id: str, *command: str) -> str:
    """``srun --overlap --jobid JOBID --ntasks=1 COMMAND``: the command's output, run in the job."""
    return _run(["srun", "--overlap", f"--jobid={job_id}", "--ntasks=1", "--nodes=1", *command])


# run inside the job: "PID command line" of each process matching $1 whose environment holds this
# job's id (Slurm sets SLURM_JOB_ID in every process of a job), the looking shell itself left out
_OF_THIS_JOB = r"""for p in $(pgrep -f -- "$1"); do
    [ "$p" = "$$" ] && continue
    grep -qxz "SLURM_JOB_ID=$SLURM_JOB_ID" "/proc/$p/environ" 2>/dev/null \
        && echo "$p $(tr '\0' ' ' < "/proc/$p/cmdline")"
done; true"""


def processes_inside(job_id: str, pattern: str, at_least: int = 0, timeout: float = 60) -> list[str]:
    """"PID command line" of the processes matching ``pattern`` that run on the job's first node
    and belong to the job (their environment's SLURM_JOB_ID, not a name: another job's program of
    the same name is not counted). ``at_least``: look again until that many run (a job that has
    just turned RUNNING may not have started its program yet), for at most ``timeout`` seconds;
    then return what is there."""
    start = time.time()
    while True:
        done = subprocess.run(["srun", "--overlap", f"--jobid={job_id}", "--ntasks=1", "--nodes=1",
                               "bash", "-c", _OF_THIS_JOB, "of-this-job", pattern],
                              capture_output=True, text=True, timeout=60)
        found = [ln.rstrip() for ln in done.stdout.splitlines() if ln.strip()]
        if len(found) >= at_least or time.time() - start > timeout:
            return found
        time.sleep(0.5)


def cancel(job_id: str, timeout: float = 60) -> dict:
    """scancel, then the job's fields once it has left the queue (state CANCELLED)."""
    _run(["scancel", job_id])
    start = time.time()
    while time.time() - start < timeout:
        info = job_info(job_id)
        if info.get("JobState") not in ("RUNNING", "PENDING", "COMPLETING", "CONFIGURING"):
            return info
        time.sleep(0.5)
    raise LaunchError(f"error: job {job_id} still in the queue {timeout:.0f} s after scancel")


def interactive(*command: str, timeout: float = 900) -> str:
    """``srun --pty COMMAND`` with a terminal lent by ``script`` (as a participant's shell has).
    ``timeout`` includes srun's own wait for a free node (a busy cluster queues it first)."""
    line = " ".join(["srun", "--pty", "--ntasks=1", "--nodes=1", *command])
    out = _run(["script", "-qec", line, "/dev/null"], timeout)
    return "\n".join(ln for ln in out.replace("\r", "").replace("\x00", "").splitlines()
                     if ln.strip() not in ("", "^@"))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("job_id")
    args = p.parse_args(argv)
    print(queue_line(args.job_id))
    print("\n".join(processes_inside(args.job_id, "python")))


if __name__ == "__main__":
    run_main(main)
