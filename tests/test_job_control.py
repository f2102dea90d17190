"""job_control without a cluster: looking inside a job asks again until its program has started."""
import subprocess

from source_code.launch import job_control


def test_processes_inside_looks_again_until_the_program_runs(monkeypatch):
    answers = iter(["", "", "4242 python -m source_code.training.single \n"])
    calls = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, next(answers), "")
    monkeypatch.setattr(job_control.subprocess, "run", fake_run)
    monkeypatch.setattr(job_control.time, "sleep", lambda s: None)
    found = job_control.processes_inside("7", "source_code.training", at_least=1)
    assert found == ["4242 python -m source_code.training.single"] and len(calls) == 3
    assert calls[0][:3] == ["srun", "--overlap", "--jobid=7"]


def test_only_the_jobs_own_processes_are_counted_not_a_namesake_of_another_job():
    import os
    import sys
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)", "nb06-namesake-probe"]
    ours = subprocess.Popen(sleeper, env={**env, "SLURM_JOB_ID": "4242"})
    other = subprocess.Popen(sleeper, env={**env, "SLURM_JOB_ID": "42420"})
    try:
        for _ in range(100):   # until both have exec'd (their command lines are there)
            seen = subprocess.run(["pgrep", "-f", "nb06-namesake-probe"], capture_output=True, text=True).stdout.split()
            if {str(ours.pid), str(other.pid)} <= set(seen):
                break
            job_control.time.sleep(0.05)
        found = subprocess.run(["bash", "-c", job_control._OF_THIS_JOB, "of-this-job", "nb06-namesake-probe"],
                               capture_output=True, text=True, env={**env, "SLURM_JOB_ID": "4242"}).stdout
        assert [ln.split()[0] for ln in found.splitlines()] == [str(ours.pid)], found
        assert "nb06-namesake-probe" in found
    finally:
        ours.kill(), other.kill(), ours.wait(), other.wait()


def test_processes_inside_returns_what_is_there_after_its_timeout(monkeypatch):
    monkeypatch.setattr(job_control.subprocess, "run",
                        lambda cmd, **kw: subprocess.CompletedProcess(cmd, 0, "", ""))
    monkeypatch.setattr(job_control.time, "sleep", lambda s: None)
    assert job_control.processes_inside("7", "x", at_least=1, timeout=0) == []


class _Clock:
    """time.time and time.sleep of a fake world: every sleep advances the clock."""
    def __init__(self):
        self.now = 0.0

    def time(self):
        return self.now

    def sleep(self, s):
        self.now += s


def _fake_jobs(monkeypatch, states):
    from source_code.launch import jobs
    clock, answers = _Clock(), iter(states)
    monkeypatch.setattr(jobs, "time", clock)
    monkeypatch.setattr(jobs, "job_info", lambda job_id: next(answers))
    monkeypatch.setattr(jobs.subprocess, "run", lambda *a, **kw: None)
    return jobs, clock


def test_waiting_behind_other_jobs_is_not_counted_against_the_jobs_timeout(monkeypatch):
    queued = [{"JobState": "PENDING", "Reason": "Resources"}] * 1000   # 500 s behind others
    running = [{"JobState": "RUNNING", "Reason": "None"}] * 100        # 50 s of its own
    jobs, clock = _fake_jobs(monkeypatch, queued + running + [{"JobState": "COMPLETED"}])
    assert jobs.wait("7", timeout=60)["JobState"] == "COMPLETED" and clock.now > 500


def test_a_job_that_runs_past_its_timeout_is_cancelled_and_named(monkeypatch):
    import pytest
    queued = [{"JobState": "PENDING", "Reason": "Priority"}] * 100
    jobs, clock = _fake_jobs(monkeypatch, queued + [{"JobState": "RUNNING"}] * 10_000)
    with pytest.raises(TimeoutError, match=r"job 7 still RUNNING after 3\d s of its own time"):
        jobs.wait("7", timeout=30)
    assert 75 < clock.now < 85


def test_a_job_pending_for_a_reason_that_never_clears_counts_from_submission(monkeypatch):
    import pytest
    jobs, clock = _fake_jobs(monkeypatch, [{"JobState": "PENDING", "Reason": "PartitionNodeLimit"}] * 10_000)
    with pytest.raises(TimeoutError, match="still PENDING"):
        jobs.wait("7", timeout=30)
    assert clock.now < 35


def test_a_job_waited_for_to_start_is_not_timed_while_it_waits_behind_others(monkeypatch):
    import pytest
    clock = _Clock()
    queued = [{"JobState": "PENDING", "Reason": "Priority"}] * 1000      # 500 s behind others
    answers = iter(queued + [{"JobState": "RUNNING", "NumTasks": "2"}])
    monkeypatch.setattr(job_control, "time", clock)
    monkeypatch.setattr(job_control, "job_info", lambda job_id: next(answers))
    assert job_control.wait_running("7", timeout=60)["NumTasks"] == "2" and clock.now >= 500
    held = iter([{"JobState": "PENDING", "Reason": "JobHeldUser"}] * 1000)  # a reason that never clears
    monkeypatch.setattr(job_control, "job_info", lambda job_id: next(held))
    with pytest.raises(job_control.LaunchError, match="did not start within 60 s"):
        job_control.wait_running("7", timeout=60)
