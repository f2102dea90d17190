"""One kind of device for every row of a table over process counts, and the table says which.

Scaling efficiencies divide samples/s of n processes by those of one; memory tables set the
peaks of N = 1, 2, 4 side by side: a GPU row beside CPU rows would compare hardware, not
scaling or sharding. Checked without a GPU: what torch sees of the GPUs is faked, and the
launches are recorded instead of run.
"""
import subprocess

import pytest

from source_code import device_policy, processes
from source_code.profiling import scaling
from source_code.sharding import memory_report
from source_code.measure import table_device


def gpus(count: int) -> device_policy.Gpus:
    if count == 0:
        return device_policy.Gpus(False)
    return device_policy.Gpus(True, count, (9, 0), "H100", ("sm_90",))


@pytest.mark.parametrize("count, env, device, line", [
    (1, {}, "cpu", "device: cpu (1 GPU < 4 processes): every row on the CPU"),
    (2, {}, "cpu", "device: cpu (2 GPUs < 4 processes): every row on the CPU"),
    (0, {}, "cpu", "device: cpu (no GPU): every row on the CPU"),
    (4, {}, "auto", "device: cuda (one GPU per process, 4 GPUs >= 4 processes)"),
    (8, {"WORKSHOP_DEVICE": "cpu"}, "cpu", "device: cpu (asked for: WORKSHOP_DEVICE=cpu): every row on the CPU"),
])
def test_the_largest_row_decides_for_every_row(count, env, device, line):
    assert table_device((1, 2, 4), env=env, gpus=gpus(count)) == (device, line)


@pytest.fixture
def machine(monkeypatch):
    """machine(n): a node whose torch sees n GPUs (the policy's own probe answers)."""
    monkeypatch.delenv("WORKSHOP_DEVICE", raising=False)
    for key in device_policy.VISIBLE + ("SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS",
                                        "SLURM_GPUS_PER_TASK"):
        monkeypatch.delenv(key, raising=False)
    return lambda n: monkeypatch.setattr(device_policy.Gpus, "probe", staticmethod(lambda: gpus(n)))


@pytest.mark.parametrize("count, device", [(1, "cpu"), (4, "auto")])
def test_scaling_runs_every_process_count_on_one_device(monkeypatch, machine, count, device):
    machine(count)
    launches = []

    def fake_spawn(fn, nproc, argv, device=None, **kwargs):
        launches.append((nproc, device))
        per_rank = 64 if "--per-rank-batch" in argv else 64 // nproc
        return [{"world_size": nproc, "global_batch": per_rank * nproc, "per_rank_batch": per_rank,
                 "samples_per_s": 1000.0 * nproc, "step_cpu_ms": 10.0}] * nproc
    monkeypatch.setattr(processes, "spawn", fake_spawn)
    result = scaling.run((1, 2, 4), batch=64, steps=2)
    assert {d for _, d in launches} == {device} and sorted({n for n, _ in launches}) == [1, 2, 4]
    assert scaling.table(result).splitlines()[0] == result["device"]
    assert result["device"].startswith("device: cuda" if device == "auto" else "device: cpu (1 GPU < 4 processes)")
    assert scaling.efficiencies(result)["weak"] == {1: 1.0, 2: 1.0, 4: 1.0}


@pytest.mark.parametrize("count, device, kind", [(1, "cpu", "cpu"), (4, "auto", "cuda")])
def test_memory_report_measures_every_world_size_on_one_device(monkeypatch, machine, count, device, kind):
    machine(count)
    spawned = []

    def fake_spawn(fn, n, *args, device=None, **kwargs):
        spawned.append((n, device))
        row = {"world_size": n, "strategy": "ddp", "device": kind, **dict.fromkeys(
            ("params", "grads", "optimizer", "total", "pred_total", "peak_bytes"), 1 << 20)}
        return [[row]]
    monkeypatch.setattr(processes, "spawn", fake_spawn)
    rows = memory_report.measure((1, 2, 4), workload_cfg(), 16, ("ddp",))
    assert spawned == [(1, device), (2, device), (4, device)]
    header = memory_report.memory_lines(rows)[0]
    assert ("allocated on the GPU" if kind == "cuda" else "process RSS, on the CPU") in header


def test_memory_lines_refuse_rows_from_different_devices():
    rows = [{"world_size": n, "strategy": "ddp", "device": d, **dict.fromkeys(
        ("params", "grads", "optimizer", "total", "pred_total", "peak_bytes"), 1)}
        for n, d in ((1, "cuda"), (2, "cpu"))]
    with pytest.raises(ValueError, match="different devices"):
        memory_report.memory_lines(rows)


def workload_cfg():
    from source_code import workload
    return workload.model_config(dim=8, n_layers=1)
