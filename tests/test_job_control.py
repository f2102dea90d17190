"""job_control without a cluster: looking inside a job asks again until its program has started."""
import subprocess

from source_code.launch import job_control


def test_processes_inside_looks_again_until_the_program_runs(monkeypatch):
    answers = iter(["", "", "4242 python -m source_code.training.single\n12 pgrep -af source_code\n"])
    calls = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, next(answers), "")
    monkeypatch.setattr(job_control.subprocess, "run", fake_run)
    monkeypatch.setattr(job_control.time, "sleep", lambda s: None)
    found = job_control.processes_inside("7", "source_code.training", at_least=1)
    assert found == ["4242 python -m source_code.training.single"] and len(calls) == 3
    assert calls[0][:3] == ["srun", "--overlap", "--jobid=7"]


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
