"""Meshes and models follow the Context's device: a GPU job builds CUDA meshes, a CPU one CPU meshes.

No GPU needed: the process's Context is faked (``distributed._CURRENT``) and
``init_device_mesh`` is replaced by a recorder that stops the function right there; the device
type it was asked for is the one the run would compute on. A "meta" Context lets model
building go on without memory (meta tensors) up to the mesh.
"""
import pytest
import torch

from source_code import device_policy, distributed
from source_code.distributed import Context
from source_code.mesh import layout, parity, pipeline3d, reference
from source_code.planner import measured
from source_code import workload
from source_code.tensor_parallel import compare, harness


class MeshAsked(Exception):
    pass


@pytest.fixture
def mesh_calls(monkeypatch):
    """Record init_device_mesh's device type everywhere it was imported; TF32 switch recorded."""
    calls = {"mesh": [], "exact_math": 0}

    def fake_mesh(device_type, shape, **kwargs):
        calls["mesh"].append(device_type)
        raise MeshAsked(device_type)

    def fake_exact():
        calls["exact_math"] += 1
        return "exact math"
    for module in (layout, parity, pipeline3d, measured, compare.dtensor):
        monkeypatch.setattr(module, "init_device_mesh", fake_mesh)
    monkeypatch.setattr(device_policy, "exact_math", fake_exact)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 4)
    return calls


def in_context(monkeypatch, device: str) -> None:
    backend = device_policy.MIXED if device.startswith("cuda") else "gloo"
    monkeypatch.setattr(distributed, "_CURRENT",
                        Context(0, 0, 4, torch.device(device), backend, "torchrun"))


RUNS = {  # name -> call that builds a mesh (on all ranks in a real run)
    "layout.describe": lambda: layout.describe(2, 2),
    "parity.run_2d": lambda: parity.run_2d(2, 2),
    "pipeline3d.run_3d": lambda: pipeline3d.run_3d(2, 1, 2),
    "measured.pp_dp": lambda: measured.measure_pipeline("pp_dp"),
    "tensor_parallel.compare": lambda: compare.build_library(torch.nn.Linear(2, 2), False),
}


@pytest.mark.parametrize("name", list(RUNS))
@pytest.mark.parametrize("device", ["cuda:1", "cpu"])
def test_the_mesh_type_is_the_context_device_type(monkeypatch, mesh_calls, name, device):
    in_context(monkeypatch, device)
    with pytest.raises(MeshAsked):
        RUNS[name]()
    assert mesh_calls["mesh"] == [torch.device(device).type]
    # parity runs turn TF32 off on a GPU, before anything is computed
    parity_run = name in ("parity.run_2d", "pipeline3d.run_3d")
    assert mesh_calls["exact_math"] == (1 if parity_run and device != "cpu" else 0)


@pytest.mark.parametrize("config", ["fsdp", "tp", "2d"])
def test_planner_measurement_builds_its_model_on_the_context_device(monkeypatch, mesh_calls, config):
    in_context(monkeypatch, "meta")
    built = []
    real = workload.build_model
    monkeypatch.setattr(workload, "build_model", lambda cfg, seed, device="cpu": built.append(
        torch.device(device)) or real(cfg, seed, device))
    with pytest.raises(MeshAsked):
        measured.build(config, workload.model_config(dim=8, n_layers=1))
    assert built == [torch.device("meta")] and mesh_calls["mesh"] == ["meta"]


def test_tensor_parallel_checks_compute_on_the_context_device(monkeypatch, mesh_calls):
    in_context(monkeypatch, "meta")
    dense, x, y = harness.on_device(harness.Workload())
    assert {p.device.type for p in dense.parameters()} == {"meta"}
    assert x.device.type == y.device.type == "meta" and mesh_calls["exact_math"] == 0


def test_tensor_parallel_checks_turn_tf32_off_on_a_gpu_before_computing(monkeypatch, mesh_calls):
    in_context(monkeypatch, "cuda:0")

    def stop():
        raise MeshAsked("exact math first")
    monkeypatch.setattr(device_policy, "exact_math", stop)
    with pytest.raises(MeshAsked, match="exact math first"):
        harness.on_device(harness.Workload())


def test_parity_tolerances_are_stated_per_device(monkeypatch, mesh_calls):
    """fp32 on the CPU; on CUDA (TF32 off) wider: other kernels for a shard than for the whole
    matrix, NCCL's ring/tree order of the partial sums of 3+ ranks."""
    assert harness.tolerance("cpu") == 1e-5 and harness.tolerance("cuda:0") == 1e-4
    assert reference.exact("cpu") == 1e-6 and mesh_calls["exact_math"] == 0
    assert reference.exact(torch.device("cuda", 3)) == 1e-5 and mesh_calls["exact_math"] == 1
