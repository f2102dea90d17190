"""Notebook 16's exercise: the reference Accelerate loop passes the check, typical wrong answers fail.

All loops run in ONE torchrun launch of 2 processes (exercises.run_loops), then each report is
judged: the check the notebook calls is judge(run_loops([fn])[0]).
"""
import pytest
import torch.nn.functional as F

from source_code.frameworks import exercises
from source_code.solutions import nb16_frameworks


def no_prepare(accelerator, model, optimizer, loader, epochs):  # the plain loop, unchanged
    for epoch in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()


def loader_not_prepared(accelerator, model, optimizer, loader, epochs):
    model, optimizer = accelerator.prepare(model, optimizer)
    for epoch in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            accelerator.backward(F.cross_entropy(model(x), y))
            optimizer.step()


def model_not_prepared(accelerator, model, optimizer, loader, epochs):
    optimizer, loader = accelerator.prepare(optimizer, loader)
    for epoch in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            accelerator.backward(F.cross_entropy(model(x), y))
            optimizer.step()


def optimizer_not_prepared(accelerator, model, optimizer, loader, epochs):
    model, loader = accelerator.prepare(model, loader)
    for epoch in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            accelerator.backward(F.cross_entropy(model(x), y))
            optimizer.step()


def plain_backward(accelerator, model, optimizer, loader, epochs):
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for epoch in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()


def todo(accelerator, model, optimizer, loader, epochs):
    raise NotImplementedError


WRONG = [(no_prepare, "different weights|never prepared"),
         (loader_not_prepared, "every process saw all the data"),
         (model_not_prepared, "different weights"),
         (optimizer_not_prepared, "optimizer was not prepared"),
         (plain_backward, r"not accelerator.backward\(loss\)")]


@pytest.fixture(scope="module")
def reports():
    fns = [nb16_frameworks.accelerate_loop, todo] + [fn for fn, _ in WRONG]
    return dict(zip([fn.__name__ for fn in fns], exercises.run_loops(fns)))


def test_solution_passes(reports):
    verdict = exercises.judge(reports["accelerate_loop"])
    assert verdict.startswith("correct") and "2 processes" in verdict


def test_unfinished_answer_is_reported(reports):
    with pytest.raises(NotImplementedError, match="not done yet"):
        exercises.judge(reports["todo"])


@pytest.mark.parametrize("wrong, message", WRONG, ids=[fn.__name__ for fn, _ in WRONG])
def test_wrong_answers_fail(reports, wrong, message):
    with pytest.raises(AssertionError, match=message):
        exercises.judge(reports[wrong.__name__])


def test_the_notebooks_check_passes_the_reference(reports, monkeypatch, capsys):
    """check_accelerate_loop itself (its probe, its print, its return) on a finished answer, fed
    the report of the reference's run above instead of a launch of its own."""
    monkeypatch.setattr(exercises, "run_loops", lambda fns: [reports["accelerate_loop"]])
    verdict = exercises.check_accelerate_loop(nb16_frameworks.accelerate_loop)
    assert verdict.startswith("correct") and capsys.readouterr().out.strip() == verdict
