"""DDP equals one process on the same global batches (and the check is able to fail)."""
import os
import re
import subprocess
import sys

import pytest
import torch
from torch.utils.data.distributed import DistributedSampler

from source_code.parity import rank_indices, tolerance
from source_code.training.loop import parse_summary

pytestmark = pytest.mark.parity
TOL = 1e-5


def parity_result(text: str) -> tuple[int, int, float]:
    m = re.search(r"parity: world_size=(\d+) steps=(\d+) max_abs_diff=(\S+)", text)
    assert m, f"no parity line in:\n{text[-2000:]}"
    return int(m[1]), int(m[2]), float(m[3])


def test_reference_order_is_distributed_samplers():
    # the one-process reference rebuilds the ranks' batches from rank_indices: it must be exact
    for n, world in [(256, 4), (10, 3)]:
        for epoch in (0, 2):
            for rank in range(world):
                s = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=3)
                s.set_epoch(epoch)
                assert rank_indices(n, world, rank, epoch, seed=3) == list(s)


def test_tolerance_is_the_cpus_on_cpu_and_wider_on_a_gpu():
    """fp32 on the CPU keeps each check's own tolerance; CUDA (other kernels, NCCL's summation
    order at 3+ ranks) gets 10 x, and the sentence printed says so."""
    assert tolerance(torch.device("cpu")) == (TOL, "tolerance 1e-05 on cpu (fp32)")
    assert tolerance("cpu", 1e-6)[0] == 1e-6
    tol, why = tolerance(torch.device("cuda", 3))
    assert tol == pytest.approx(10 * TOL) and "cuda:3" in why and "NCCL" in why
    assert tolerance("cuda", 1e-6)[0] == pytest.approx(1e-5)


@pytest.mark.parametrize("nproc", [1, 4])  # 2 processes: notebook 05 runs it and asserts the same
def test_ddp_matches_one_process(torchrun, nproc):
    out = torchrun("source_code.parity", nproc=nproc).stdout
    world, steps, diff = parity_result(out)
    assert (world, steps) == (nproc, 12)
    assert diff <= TOL


@pytest.mark.parametrize("broken", ["sum", "no-set-epoch"])
def test_broken_ddp_is_caught(torchrun, broken):
    res = torchrun("source_code.parity", "--break", broken, nproc=2, check=False)
    _, _, diff = parity_result(res.stdout)
    assert diff > TOL, f"--break {broken} went unnoticed (max_abs_diff={diff})"
    assert res.returncode != 0
    assert "differ by" in res.stdout


def test_dataparallel_on_cpu_is_the_single_process_run(root):
    """Without GPUs DataParallel falls back to one device: the same losses as single.py, bit for bit."""
    flags = ["--epochs", "1", "--max-steps", "4"]
    runs = {}
    for script in ("single", "dataparallel"):
        res = subprocess.run([sys.executable, "-m", f"source_code.training.{script}", *flags], cwd=root,
                             capture_output=True, text=True, check=True,
                             env={**os.environ, "OMP_NUM_THREADS": "1"})
        runs[script] = res.stdout
    if torch.cuda.device_count() < 2:
        assert "falls back to one device" in runs["dataparallel"]
        losses = [re.search(r"loss (\S+)", runs[s])[1] for s in runs]
        assert losses[0] == losses[1]
    for s in runs:
        assert parse_summary(runs[s])["world_size"] == 1
