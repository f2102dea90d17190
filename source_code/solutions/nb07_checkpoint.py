"""Reference solution of notebook 07's exercise: a save that a kill cannot break.

    from source_code.launch.save_drill import check_atomic_save
    check_atomic_save(atomic_save)
"""
from __future__ import annotations

import os
import tempfile

import torch


def atomic_save(obj, path) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    # 1. write a temporary file in the SAME directory (a rename is atomic only within one file system)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=os.path.basename(path) + ".", suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())  # 2. the bytes are on the disk before the name points at them
    os.replace(tmp, path)  # 3. PATH is now the old file or the new one, never a half
