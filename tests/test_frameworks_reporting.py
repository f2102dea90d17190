"""Reporting collectives of the framework scripts work in the framework's own process group.

Lightning, Accelerate and DeepSpeed create a plain "nccl" group on GPUs: it has no CPU backend,
so a reporting tensor (a loss to average, a weight spread to check) must live on this process's
GPU there, and on the CPU in a gloo group (or our mixed one). Checked without a GPU: the group's
backend and torch.cuda are faked, the collectives are recorded instead of run.
"""
import ast
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from source_code.distributed import report_device
from source_code.frameworks import exercise_runner

FRAMEWORKS = Path(exercise_runner.__file__).parent
# collectives that send a tensor: each needs it where the group can carry it
TENSOR_COLLECTIVES = {"all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce",
                      "reduce_scatter", "reduce_scatter_tensor", "gather", "scatter", "all_to_all",
                      "all_to_all_single", "send", "recv", "isend", "irecv"}
REAL_CUDA = torch.cuda.is_available()


def fake_group(monkeypatch, backend: str, gpu: int = 1) -> list:
    """A process group with ``backend`` on a machine with a GPU ``gpu`` current; returns the list
    the faked collectives append (name, tensor device) to."""
    seen = []
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: backend)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: gpu)
    monkeypatch.setattr(dist, "broadcast", lambda t, src, group=None: seen.append(("broadcast", t.device)))
    monkeypatch.setattr(dist, "all_reduce", lambda t, op=None, group=None: seen.append(("all_reduce", t.device)))
    return seen


@pytest.mark.parametrize("backend, device", [
    ("nccl", "cuda:1"),                    # a framework's group on a GPU: the current GPU
    ("cpu:gloo,cuda:nccl", "cpu"),         # our mixed group: gloo carries CPU tensors
    ("gloo", "cpu"),                       # CPU runs, Accelerator(cpu=True)
])
def test_report_device_follows_the_backend_of_the_group(monkeypatch, backend, device):
    fake_group(monkeypatch, backend)
    assert report_device() == torch.device(device)


def test_weight_spread_stays_on_the_cpu_in_a_gloo_group(monkeypatch):
    seen = fake_group(monkeypatch, "gloo")
    assert exercise_runner.weight_spread(nn.Linear(3, 2)) == 0.0
    assert seen == [("broadcast", torch.device("cpu")), ("all_reduce", torch.device("cpu"))]


def test_weight_spread_sends_its_tensors_through_the_gpu_of_a_plain_nccl_group(monkeypatch):
    seen = fake_group(monkeypatch, "nccl", gpu=0)
    if REAL_CUDA:
        exercise_runner.weight_spread(nn.Linear(3, 2))
        assert [d.type for _, d in seen] == ["cuda", "cuda"]
    else:  # the move to cuda:0 is tried (and fails here) before any collective sees a CPU tensor
        with pytest.raises((RuntimeError, AssertionError)):
            exercise_runner.weight_spread(nn.Linear(3, 2))
        assert seen == []


def test_every_collective_in_the_frameworks_package_asks_report_device():
    """A new reporting helper that builds a CPU tensor for a collective fails here, not on a GPU
    node: each function of source_code/frameworks/ that calls dist.<collective> must place its
    tensor with report_device (all_reduce_mean does it inside)."""
    offenders = []
    for path in sorted(FRAMEWORKS.glob("*.py")):
        tree = ast.parse(path.read_text())
        for fn in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            calls = {n.func.attr for n in ast.walk(fn) if isinstance(n, ast.Call)
                     and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name)
                     and n.func.value.id == "dist"}
            names = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)}
            if calls & TENSOR_COLLECTIVES and "report_device" not in names:
                offenders.append(f"{path.name}:{fn.name}")
    assert offenders == []
    assert any("report_device" in p.read_text() for p in FRAMEWORKS.glob("*.py"))
