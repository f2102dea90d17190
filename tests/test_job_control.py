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
