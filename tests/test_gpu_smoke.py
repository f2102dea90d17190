"""make gpu-smoke: its list, its skip lines without a GPU, its harness on the CPU, its MFU sizing."""
import importlib.util
import re
import subprocess
import sys

import pytest
import torch

from source_code.basics import hardware
from source_code.gpu_smoke.__main__ import CHECKS
from source_code.gpu_smoke.harness import Env, computed_on
from source_code.gpu_smoke.single import MFU_DEFAULT, mfu_bytes, size_mfu

# every entry point with a GPU path, as the README promises (single GPU, then 2+, then 4)
EXPECTED = {
    "policy": 1, "mixed": 1, "main_job": 1, "resume": 1, "fallback": 1, "parity": 1, "sync": 1,
    "dataparallel": 1, "memory": 1, "lightning": 1, "lightning_fsdp": 1, "accelerate": 1,
    "accelerate_fsdp2": 1, "deepspeed": 1, "sharding_dcp": 1, "zero": 1, "profiler": 1,
    "memory_report": 1, "mfu": 1, "memory_precision": 1, "allocator": 1, "offload": 1, "own_fsdp_bf16": 1,
    "nccl_multi": 2, "main_job_multi": 2, "ring": 3, "ddp_compare": 2, "zero_multi": 2,
    "sharding_reshard": 2, "pipeline_own": 2, "pipeline_lib": 2, "tp_own": 2, "tp_dtensor": 2,
    "tp_compare": 2, "hang": 2, "mesh_2d": 4, "context_parallel": 2, "expert_parallel": 2,
    "moe_bench": 2, "evaluation": 2,
}
LINE = re.compile(r"^(\S+)\s+(\d+) (gpus?)\s+(.+)$")
RESULT = re.compile(r"^(\S+)\s+[\d.]+s  (ok|FAIL|skipped): (.*)$")


def _smoke(*args):
    return subprocess.run([sys.executable, "-m", "source_code.gpu_smoke", *args],
                          capture_output=True, text=True, timeout=300)


def _results(stdout: str) -> dict:
    return {m.group(1): (m.group(2), m.group(3)) for m in map(RESULT.match, stdout.splitlines()) if m}


def test_list_names_every_check_its_gpus_and_an_importable_entry_point():
    res = _smoke("--list")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    assert len(lines) == len(EXPECTED) == len(CHECKS)
    for line in lines:
        m = LINE.match(line)
        assert m, line
        name, n, word, runs = m.groups()
        assert EXPECTED[name] == int(n) and word == ("gpu" if n == "1" else "gpus"), line
        modules = re.findall(r"\bsource_code(?:\.\w+)+", runs)
        assert modules, f"{name} names no entry point: {line}"
        for module in modules:
            assert importlib.util.find_spec(module) is not None, f"{name}: {module} is not importable"
    assert {LINE.match(ln).group(1) for ln in lines} == set(EXPECTED)


def test_without_a_gpu_every_check_says_what_it_needs():
    if torch.cuda.is_available():
        pytest.skip("on a GPU machine `make gpu-smoke` is the real thing")
    res = _smoke()
    assert res.returncode == 0, res.stdout + res.stderr
    assert "no GPU visible" in res.stdout
    got = _results(res.stdout)
    assert set(got) == set(EXPECTED), res.stdout
    for name, n in EXPECTED.items():
        assert got[name] == ("skipped", f"needs {n} gpu{'s' if n > 1 else ''}"), (name, got[name])


def test_the_harness_runs_its_checks_on_the_cpu():
    res = _smoke("--device", "cpu", "--only",
                 "policy,mixed,main_job,resume,nccl_multi,memory,mfu,lightning_fsdp")
    assert res.returncode == 0, res.stdout + res.stderr
    got = _results(res.stdout)
    assert {k: v[0] for k, v in got.items()} == {
        "policy": "ok", "mixed": "ok", "main_job": "ok", "resume": "ok", "nccl_multi": "skipped",
        "memory": "skipped", "mfu": "skipped", "lightning_fsdp": "skipped"}, res.stdout
    assert got["main_job"][1].startswith("1 process on cpu: accuracy"), got["main_job"]
    assert got["resume"][1].startswith("resumed on cpu after epoch 2"), got["resume"]
    assert got["nccl_multi"][1] == "needs 2 gpus (NCCL between ranks)"
    assert got["mfu"][1] == "MFU with bf16 autocast and torch.compile: needs a GPU"
    assert res.stdout.strip().splitlines()[-1] == "gpu-smoke: 8 of 8 checks did not fail"


# a bare GPU machine: its own python3, no Jupyter, no datasets, maybe no framework
_BARE = """
import sys
for name in ("datasets", "jupyter", "jupyterlab", "notebook", "nbval", "nbformat", "IPython",
             "deepspeed", "lightning", "accelerate"):
    sys.modules[name] = None   # import fails, find_spec says absent
from source_code.gpu_smoke.__main__ import CHECKS
from source_code.gpu_smoke.harness import main
only = "policy,deepspeed,lightning,accelerate"
sys.exit(main(CHECKS, ["--list"]) or main(CHECKS, ["--device", "cpu", "--only", only]))
"""


def test_it_runs_without_jupyter_datasets_or_the_frameworks():
    res = subprocess.run([sys.executable, "-c", _BARE], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    got = _results(res.stdout)
    assert got["policy"][0] == "ok"
    for name in ("deepspeed", "lightning", "accelerate"):
        assert got[name] == ("skipped", f"not installed ({name})"), got[name]


def test_unknown_check_is_one_line():
    res = _smoke("--only", "bogus")
    assert res.returncode == 2 and res.stderr.strip().startswith("error: unknown check(s) bogus")


def test_where_a_script_computed_comes_from_its_own_output(tmp_path):
    gpu, cpu = Env("cuda", 1, tmp_path, {}), Env("cpu", 0, tmp_path, {})
    assert computed_on("FSDP2 training ... cpu:gloo,cuda:nccl on cuda", gpu, "m") == "cuda"
    assert computed_on("rank 0/1 local_rank=0 node=n launcher=torchrun device=cuda:0", gpu, "m") == "cuda:0"
    assert computed_on("profiled 3 steps, gloo on cpu; rank 0's operators", cpu, "m") == "cpu"
    with pytest.raises(AssertionError, match="print its device"):
        computed_on("summary: world_size=1 accuracy=0.9", gpu, "m")
    with pytest.raises(AssertionError, match="computed on cpu, not on cuda"):
        computed_on("training smallcnn: gloo on cpu", gpu, "m")


def test_the_mfu_shape_is_sized_from_free_memory():
    gib = 2 ** 30
    assert 20 * gib < mfu_bytes(MFU_DEFAULT) < 32 * gib  # the default needs ~30 GB
    assert size_mfu(79 * gib) == MFU_DEFAULT               # an H100 runs the default
    small = size_mfu(15 * gib)                             # a 16 GB card: fewer layers first
    assert mfu_bytes(small) <= 0.7 * 15 * gib
    assert small["dim"] == MFU_DEFAULT["dim"] and small["layers"] < MFU_DEFAULT["layers"]
    assert size_mfu(1 * gib)["dim"] <= 1024                # a tiny card: the width goes last


def test_hardware_report_knows_rocm(tmp_path, monkeypatch):
    info = {**hardware.describe(), "torch_built_with_cuda": None, "torch_built_with_rocm": "6.2",
            "cuda_available": True,
            "gpus": [{"index": 0, "name": "AMD Instinct MI250X", "memory_gib": 64.0, "multiprocessors": 110}]}
    report = hardware.format_report(info)
    assert "built with ROCm 6.2" in report and "110 CUs" in report
    fake = tmp_path / "rocm-smi"
    fake.write_text("#!/bin/sh\necho 'GPU0 GPU1 topology'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert hardware.topology() == "GPU0 GPU1 topology"
