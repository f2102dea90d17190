"""Notebook 07's save drill: the negative control fails, atomic saves pass, the exercise check
tells wrong answers apart from the reference solution."""
from __future__ import annotations

import io
import os
import shutil
import tempfile
from os import fsync, replace
from pathlib import Path

import pytest
import torch

from source_code.checkpoint import atomic_save
from source_code.launch import save_drill
from source_code.solutions import nb07_checkpoint

pytestmark = pytest.mark.fault


def test_plain_torch_save_killed_mid_write_leaves_a_file_that_does_not_load(tmp_path):
    res = save_drill.kill_mid_write(torch.save, tmp_path / "snap.pt")
    assert res["killed_mid_write"] and not res["loads"]
    assert "PytorchStreamReader" in res["error"] or "Error" in res["error"]


def test_the_project_atomic_save_survives_the_same_kill(tmp_path):
    res = save_drill.kill_mid_write(atomic_save, tmp_path / "snap.pt")
    assert res["killed_mid_write"] and res["loads"] and res["complete"] and res["version"] >= 1


def test_exercise_check_accepts_the_reference_solution(tmp_path):
    assert save_drill.check_atomic_save(nb07_checkpoint.atomic_save, tmp_path).startswith("correct")


def _copy_into_place(obj, path):  # a typical wrong answer: the copy is a second, breakable write
    tmp = str(path) + ".tmp"
    torch.save(obj, tmp)
    shutil.copyfile(tmp, path)


def _not_done(obj, path):
    raise NotImplementedError


def _no_fsync(obj, path):         # renamed into place while its bytes may still be in the page cache
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path))
    with os.fdopen(fd, "wb") as f:
        torch.save(obj, f)
    os.replace(tmp, path)


def _fsync_before_flush(obj, path):   # the file object's buffer still holds the last bytes
    buf = io.BytesIO()
    torch.save(obj, buf)
    data = buf.getvalue()
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path))
    with os.fdopen(fd, "wb") as f:
        f.write(data[:-100])
        f.write(data[-100:])     # smaller than the buffer: it stays there until the flush
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _removed_then_renamed(obj, path):   # for a moment there is no snapshot at all
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path))
    with os.fdopen(fd, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    if os.path.exists(path):
        os.remove(path)
    os.rename(tmp, path)


def _temporary_file_elsewhere(obj, path):   # the rename crosses directories (maybe file systems)
    elsewhere = Path(path).parent.parent / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=elsewhere)
    with os.fdopen(fd, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    shutil.move(tmp, path)


def _the_projects_own(obj, path):
    atomic_save(obj, path)


def _right_in_other_words(obj, path):  # saved by name, synced through a second descriptor, Path.replace
    tmp = Path(str(path) + ".partial")
    torch.save(obj, tmp)
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fdatasync(fd)
    finally:
        os.close(fd)
    tmp.replace(path)


def _right_with_names_from_os(obj, path):  # `from os import fsync, replace`; a NamedTemporaryFile
    with tempfile.NamedTemporaryFile(dir=os.path.dirname(path), delete=False) as f:
        torch.save(obj, f)
        f.flush()
        fsync(f.fileno())
    replace(f.name, path)


@pytest.mark.parametrize("right", [_right_in_other_words, _right_with_names_from_os],
                         ids=["pathlib and fdatasync", "names imported from os"])
def test_exercise_check_accepts_a_right_answer_in_other_words(right, tmp_path):
    assert save_drill.check_atomic_save(right, tmp_path).startswith("correct")


@pytest.mark.parametrize("wrong, message", [
    (torch.save, "the snapshot at the real path does not load"),
    (_copy_into_place, "writes the new bytes into the file already at PATH"),
    (_no_fsync, "before all of its bytes are synced"),
    (_fsync_before_flush, "before all of its bytes are synced"),
    (_removed_then_renamed, "removes PATH before the new file takes its place"),
    (_temporary_file_elsewhere, "written in another directory"),
    (_the_projects_own, "the workshop's own atomic_save"),
    (atomic_save, "the workshop's own atomic_save"),
], ids=["torch.save", "copy into place", "no fsync", "fsync before flush", "removed, then renamed", "temporary file elsewhere",
        "calls the project's", "is the project's"])
def test_exercise_check_rejects_typical_wrong_answers(wrong, message, tmp_path):
    with pytest.raises(AssertionError, match=message):
        save_drill.check_atomic_save(wrong, tmp_path)


def test_exercise_check_says_when_the_exercise_is_not_done():
    with pytest.raises(NotImplementedError, match="not done yet"):
        save_drill.check_atomic_save(_not_done)
