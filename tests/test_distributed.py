"""The shared plumbing: rank discovery, device choice, launch errors and clean exits."""
import os
import subprocess
import sys

import pytest
import torch

from source_code import distributed
from source_code.distributed import LaunchError, ranks_from_env
from source_code.processes import rank_lines, spawn
from source_code.training.loop import parse_summary


def test_ranks_from_torchrun_env():
    env = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "TORCHELASTIC_RUN_ID": "x"}
    assert ranks_from_env(env) == (3, 1, 4, "torchrun")


def test_ranks_from_srun_step_env():
    env = {"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_STEP_NUM_TASKS": "8", "SLURM_NTASKS": "8"}
    assert ranks_from_env(env) == (5, 1, 8, "srun")


def test_batch_script_is_not_a_rank():
    # inside an sbatch script (no srun step) SLURM_PROCID=0 and SLURM_NTASKS=N are set, but
    # a plain `python train.py` there is one process, not rank 0 of N
    assert ranks_from_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "4"}) is None


def test_half_set_env_is_a_clear_error():
    with pytest.raises(LaunchError, match="WORLD_SIZE not set"):
        ranks_from_env({"RANK": "0"})


def test_device_choice_follows_cuda():
    device, backend = distributed.pick_device(0)
    if torch.cuda.is_available():
        assert (device.type, backend) == ("cuda", "nccl")
    else:
        assert (device, backend) == (torch.device("cpu"), "gloo")


def _script_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
           and not k.startswith("SLURM_")}
    env.update(extra)
    return env


def test_no_launcher_prints_one_line_with_the_command():
    res = subprocess.run([sys.executable, "-m", "source_code.training.ddp"], capture_output=True,
                         text=True, env=_script_env())
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0
    assert "torchrun --standalone --nproc-per-node=2 -m source_code.training.ddp" in res.stderr


def test_busy_port_is_a_clear_error():
    import socket
    with socket.socket() as s:
        s.bind(("", 0))
        s.listen()
        port = s.getsockname()[1]
        res = subprocess.run([sys.executable, "-m", "source_code.training.ddp"], capture_output=True,
                             text=True, env=_script_env(RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                                                        MASTER_PORT=str(port)))
    assert res.returncode == 2
    assert f"MASTER_PORT {port} is busy" in res.stderr and "export MASTER_PORT=" in res.stderr


def test_indivisible_batch_names_the_fix(torchrun):
    res = torchrun("source_code.training.ddp", "--batch-size", "63", nproc=2, check=False)
    assert res.returncode != 0
    assert "--batch-size 63 does not divide among 2 processes; use a multiple of 2" in res.stdout


def _rank_and_world():
    import torch.distributed as dist
    return dist.get_rank(), dist.get_world_size()


def test_spawn_returns_one_result_per_rank():
    assert spawn(_rank_and_world, 3) == [(0, 3), (1, 3), (2, 3)]


def test_main_job_reaches_its_accuracy(torchrun):
    out = rank_lines(torchrun("source_code.training.ddp").stdout)
    s = parse_summary(out)
    assert s["world_size"] == 2 and s["accuracy"] >= 0.95, out


@pytest.mark.slow
def test_twenty_torchrun_launches_all_exit_cleanly(torchrun):
    """torch 2.14.1 + gloo aborted at exit in ~2-3 of 10 launches without a clean shutdown."""
    failures = []
    for i in range(20):
        res = torchrun("source_code.training.ddp", "--epochs", "1", "--max-steps", "3", check=False)
        if res.returncode != 0 or "terminate called" in res.stdout:
            failures.append((i, res.returncode, res.stdout[-300:]))
    assert not failures, failures
