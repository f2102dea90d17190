"""Shared test plumbing: the repository root, a torchrun runner, and the PATH with the venv."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
# scripts started by the tests (torchrun, sbatch jobs) must find the venv's executables
os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
# one intra-op thread for in-process tests: on 2 cores, two threads spin against the worker
# processes the multi-process tests start
torch.set_num_threads(1)


@pytest.fixture
def root() -> Path:
    return ROOT


@pytest.fixture
def torchrun():
    """torchrun(module, *args, nproc=2, check=True) -> CompletedProcess (stdout+stderr merged)."""
    from source_code.processes import torchrun as run
    return run
