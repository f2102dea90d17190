"""The peak-memory reader asks CUDA only when the block computes on CUDA.

A rank that fell back to the CPU (more processes than GPUs) must not touch torch.cuda: the
first call creates a CUDA context, hundreds of MiB on a GPU that is someone else's. Checked
without a GPU: torch.cuda claims to be available and every memory function is a trap.
"""
import pytest
import torch

from source_code.measure import PeakRSS

MEMORY_FUNCTIONS = ("reset_peak_memory_stats", "memory_allocated", "max_memory_allocated")


@pytest.fixture
def cuda_present(monkeypatch):
    """torch.cuda says a GPU is there; its memory functions record their device argument."""
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    values = {"reset_peak_memory_stats": None, "memory_allocated": 100, "max_memory_allocated": 1100}
    for name in MEMORY_FUNCTIONS:
        monkeypatch.setattr(torch.cuda, name,
                            lambda device=None, _n=name: calls.append((_n, device)) or values[_n])
    return calls


def test_a_cpu_block_never_calls_into_cuda(cuda_present):
    with PeakRSS("cpu") as peak:
        kept = bytearray(8 << 20)  # 8 MiB touched: resident
        kept[::4096] = b"x" * len(kept[::4096])
    assert cuda_present == []
    assert peak.cuda_peak_delta == 0 and peak.peak_bytes == peak.peak_delta
    del kept


def test_a_cuda_block_reads_the_peak_of_its_own_gpu(cuda_present):
    gpu = torch.device("cuda", 2)
    with PeakRSS(gpu) as peak:
        pass
    assert [name for name, _ in cuda_present] == ["reset_peak_memory_stats", "memory_allocated",
                                                  "max_memory_allocated"]
    assert {device for _, device in cuda_present} == {gpu}
    assert peak.peak_bytes == peak.cuda_peak_delta == 1000
