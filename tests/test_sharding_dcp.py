"""Sharded checkpoints: exact resume, resharding 2 -> 4 -> 1, a kill during a DCP save, one-line errors."""
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from source_code.training.loop import parse_summary

TRAIN = "source_code.sharding.train"
ARGS = ["--max-steps", "2"]


def _run(torchrun, module, *args, nproc=2):
    out = torchrun(module, *args, nproc=nproc).stdout
    assert "terminate called" not in out, out[-2000:]   # the clean-exit guard, every launch
    return out


def _weights(path):
    return torch.load(path, map_location="cpu", weights_only=False)["model"]


@pytest.mark.parity
@pytest.mark.slow
def test_exact_resume_and_resharding_2_4_1(torchrun, tmp_path):
    # 2 -> 4 loaded exactly (model and optimizer state equal to the full state saved from) is
    # notebook 09's DCP cell, asserted there with the same numbers; here what it does not run:
    # exact resume on 2, training on after 2 -> 4, and 4 -> 1
    # uninterrupted: 2 epochs on 2 ranks
    a = _run(torchrun, TRAIN, *ARGS, "--epochs", 2, "--export", tmp_path / "a.pt")
    # 1 epoch on 2 ranks, checkpoint; resume on 2 ranks for epoch 2: exactly the same weights
    ck = tmp_path / "ck"
    _run(torchrun, TRAIN, *ARGS, "--epochs", 1, "--checkpoint", ck)
    shutil.copytree(ck, tmp_path / "ck4")
    b = _run(torchrun, TRAIN, *ARGS, "--epochs", 2, "--checkpoint", ck, "--resume",
             "--export", tmp_path / "b.pt")
    steps = 2 * int(ARGS[-1])
    assert "resumed from" in b and parse_summary(b)["steps"] == parse_summary(a)["steps"] == steps
    wa, wb = _weights(tmp_path / "a.pt"), _weights(tmp_path / "b.pt")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    # 2 -> 4: training continues on 4 ranks from the 2-rank checkpoint (same global batches:
    # close to the 2-rank run)
    c = _run(torchrun, TRAIN, *ARGS, "--epochs", 2, "--checkpoint", tmp_path / "ck4", "--resume",
             "--export", tmp_path / "c.pt", nproc=4)
    assert "saved by 2 ranks" in c and parse_summary(c)["world_size"] == 4
    assert parse_summary(c)["steps"] == steps
    wc = _weights(tmp_path / "c.pt")
    assert max((wa[k] - wc[k]).abs().max().item() for k in wa) < 1e-4
    # 4 -> 1: the 4-rank checkpoint on one process equals the full state exported from it
    out = _run(torchrun, "source_code.sharding.dcp_demo", "--checkpoint", tmp_path / "ck4",
               "--full", tmp_path / "c.pt", nproc=1)
    assert "saved_by=4 loaded_on=1 local_fraction=1.000 model_max_abs_diff=0 optim_max_abs_diff=0" in out


def _children(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (torchrun starts each rank in its own session, so
    killing torchrun's process group would leave the ranks running)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid == pid:
                out.append(int(entry))
    return out


@pytest.mark.fault
def test_kill_during_dcp_save_leaves_previous_checkpoint(torchrun, tmp_path):
    ck = tmp_path / "ck"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "-m", TRAIN, "--dim", "256", "--layers", "4", "--epochs", "1000", "--max-steps", "1",
           "--checkpoint", str(ck)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    killed_mid_save = False
    try:
        deadline = time.time() + 180
        while time.time() < deadline and proc.poll() is None:
            partial = [p for p in ck.glob("step-*.partial-*")] if ck.exists() else []
            if partial and (ck / "latest").exists() and any(p.iterdir() for p in partial):
                for pid in _children(proc.pid) + [proc.pid]:  # every rank, then torchrun
                    os.kill(pid, signal.SIGKILL)
                killed_mid_save = True
                break
            time.sleep(0.01)
    finally:
        for pid in _children(proc.pid) + ([proc.pid] if proc.poll() is None else []):
            os.kill(pid, signal.SIGKILL)
        proc.wait()
    assert killed_mid_save, "no save was caught in flight"
    assert list(ck.glob("step-*.partial-*")), "the interrupted save left its partial directory"
    name = (ck / "latest").read_text().strip()
    assert re.fullmatch(r"step-\d{8}", name) and (ck / name / ".metadata").exists()
    out = _run(torchrun, "source_code.sharding.dcp_demo", "--checkpoint", ck, nproc=1)
    assert "saved_by=2 loaded_on=1" in out


@pytest.mark.parametrize("args,message", [
    (["--batch-size", "33"], "does not divide among 2 processes"),
    (["--resume"], "--resume needs --checkpoint"),
    (["--dim", "30"], "multiple of --heads"),
])
def test_bad_flags_fail_in_one_line_before_the_group(torchrun, args, message):
    res = torchrun(TRAIN, *args, nproc=2, check=False)
    assert res.returncode != 0
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("error:")]
    assert lines and message in lines[0]
