"""Notebook 19's exercise: the check passes the reference and names what typical wrong answers
miss, in one line each (one set of 2 processes for all of them).

    .venv/bin/python -m pytest tests/test_capstone_exercise.py -q
"""
from __future__ import annotations

import torch.distributed as dist

from source_code.capstone import exercises
from source_code.solutions.nb19_capstone import sync_gradients


def over_dp_only(model, dp_group, cp_group):
    for p in model.parameters():
        dist.all_reduce(p.grad, group=dp_group)


def over_cp_only(model, dp_group, cp_group):
    for p in model.parameters():
        dist.all_reduce(p.grad, group=cp_group)


def averaged(model, dp_group, cp_group):
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()


def nothing(model, dp_group, cp_group):
    pass


def raises(model, dp_group, cp_group):
    raise RuntimeError("forgot the groups")


def test_reference_passes_and_wrong_answers_are_named():
    got = exercises.diagnose([sync_gradients, over_dp_only, over_cp_only, averaged, nothing, raises])
    (ok, line), *wrong = got
    assert ok and line.startswith("correct"), line
    expected = ["context-parallel rank", "data-parallel rank", "divided by the number of ranks",
                "on every mesh", "forgot the groups"]
    for (ok, line), words in zip(wrong, expected):
        assert not ok and words in line and "\n" not in line, line


def test_unfinished_exercise_says_so_in_one_line():
    def sync_gradients(model, dp_group, cp_group):
        raise NotImplementedError
    line = exercises.check_sync_gradients(sync_gradients)
    assert line.startswith("not done yet") and "\n" not in line, line
