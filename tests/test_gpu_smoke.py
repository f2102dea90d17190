"""make gpu-smoke: without a GPU it says so and exits 0; its harness runs on the CPU too."""
import subprocess
import sys

import torch

from source_code.basics import hardware


def _smoke(*args):
    return subprocess.run([sys.executable, "-m", "source_code.gpu_smoke", *args],
                          capture_output=True, text=True, timeout=300)


def test_without_a_gpu_the_smoke_says_so_and_succeeds():
    if torch.cuda.is_available():
        return  # on a GPU machine `make gpu-smoke` is the real thing
    res = _smoke()
    assert res.returncode == 0, res.stderr
    assert "skipped: no GPU visible" in res.stdout


def test_the_harness_runs_its_checks_on_the_cpu():
    res = _smoke("--device", "cpu", "--only", "policy,mixed,nccl_multi,memory,mfu", "--mfu-dim", "512")
    assert res.returncode == 0, res.stdout + res.stderr
    lines = {ln.split()[1]: ln.split()[0] for ln in res.stdout.splitlines()[1:-1]}
    assert lines == {"policy": "ok", "mixed": "ok", "nccl_multi": "skipped", "memory": "skipped",
                     "mfu": "skipped"}, res.stdout
    assert "needs 2 GPUs" in res.stdout
    assert "MFU with bf16 autocast and torch.compile: needs a GPU" in res.stdout


def test_unknown_check_is_one_line():
    res = _smoke("--only", "bogus")
    assert res.returncode == 2 and res.stderr.strip().startswith("error: unknown check(s) bogus")


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
