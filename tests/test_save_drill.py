"""Notebook 07's save drill: the negative control fails, atomic saves pass, the exercise check
tells wrong answers apart from the reference solution."""
from __future__ import annotations

import shutil

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


@pytest.mark.parametrize("wrong, message", [
    (torch.save, "does not load"),
    (_copy_into_place, "does not load"),
])
def test_exercise_check_rejects_typical_wrong_answers(wrong, message, tmp_path):
    with pytest.raises(AssertionError, match=message):
        save_drill.check_atomic_save(wrong, tmp_path)


def test_exercise_check_says_when_the_exercise_is_not_done():
    with pytest.raises(NotImplementedError, match="not done yet"):
        save_drill.check_atomic_save(_not_done)
