"""The torch each feature needs (torch_versions) and the support-table runner (torch_support)."""
from pathlib import Path

import pytest
import torch

from source_code import torch_support, torch_versions
from source_code.errors import LaunchError


@pytest.mark.parametrize("feature", sorted(f for f, n in torch_versions.NEEDS.items() if n.version > (2, 6)))
def test_an_older_torch_is_refused_in_one_line_on_the_cpu_only(feature, monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.6.0+cu124")
    with pytest.raises(LaunchError) as err:
        torch_versions.require(feature, "cpu")
    msg = err.value.message
    assert msg.startswith("error: ") and "\n" not in msg and "needs torch 2." in msg
    assert "GPUs with NCCL run it" in msg  # both limits are gloo/CPU ones
    torch_versions.require(feature, torch.device("cuda", 0))  # a GPU run goes ahead
    monkeypatch.setattr(torch, "__version__", "2.12.1+cpu")
    torch_versions.require(feature, "cpu")


def test_the_pinned_torch_supports_everything():
    assert all(torch_versions.supported(f, "cpu") for f in torch_versions.NEEDS)


def test_the_runner_tells_refusals_from_failures(tmp_path: Path):
    # a script started without its launcher refuses in one line (exit 2): "refused", not "FAIL"
    verdict, detail = torch_support.run_one("python", 1, "source_code.training.ddp", "", tmp_path, 60)
    assert verdict == "refused" and detail.startswith("error: no launcher found")
    verdict, detail = torch_support.run_one("python", 1, "source_code.no_such_module", "", tmp_path, 60)
    assert verdict == "FAIL" and "No module named" in detail


def test_the_processes_device_auto_counts_as_a_gpu(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.6.0")
    assert torch_versions.supported("fsdp2", "auto") and not torch_versions.supported("fsdp2", "cpu")


def test_a_version_that_broke_a_feature_is_refused_between_two_that_run_it(monkeypatch):
    """2.9's pipeline stages abort on gloo, 2.8's and 2.10's run them: 2.9 alone is refused."""
    for v, ok in (("2.6.0", True), ("2.8.0", True), ("2.9.1+cu128", False), ("2.10.0", True)):
        monkeypatch.setattr(torch, "__version__", v)
        assert torch_versions.supported("gpipe", "cpu") is ok, v
    monkeypatch.setattr(torch, "__version__", "2.9.1+cu128")
    msg = torch_versions.refusal("gpipe")
    assert "needs torch 2.6 or newer but 2.9, this is 2.9.1+cu128" in msg and "Received data size" in msg
    assert torch_versions.supported("gpipe", torch.device("cuda", 0))   # a gloo limit: NCCL goes ahead
