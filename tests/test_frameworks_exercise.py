"""Notebook 16's exercise: the reference Accelerate loop passes the check, typical wrong answers fail.

All loops run in ONE torchrun launch of 2 processes (exercises.run_loops), then each report is
judged: the check the notebook calls is judge(run_loops([fn])[0], the notebook's names).
"""
from __future__ import annotations

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


def prepared_in_two_calls(accelerator, model, optimizer, loader, epochs):  # right, written another way
    model, optimizer = accelerator.prepare(model, optimizer)
    batches = accelerator.prepare_data_loader(loader)
    for _ in range(epochs):
        for inputs, targets in batches:
            accelerator.backward(F.cross_entropy(model(inputs), targets))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)


def right_in_other_words(accelerator: Accelerator, model, optimizer, loader, epochs) -> None:  # noqa: F821
    """One prepare call per object, accumulate(), zero_grad after the step, an Accelerator of its
    own made only to read the device, the accelerator's memory freed and its training ended."""
    from accelerate import Accelerator
    device = Accelerator(cpu=True).device
    model = accelerator.prepare(model)
    optimizer = accelerator.prepare(optimizer)
    loader = accelerator.prepare(loader)
    for _ in range(epochs):
        for x, y in loader:
            with accelerator.accumulate(model):
                accelerator.backward(F.cross_entropy(model(x.to(device)), y))
                optimizer.step()
                optimizer.zero_grad()
    accelerator.free_memory()
    accelerator.end_training()     # a script's last line: the launch still judges every function


def one_epoch_only(accelerator, model, optimizer, loader, epochs):
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for x, y in loader:
        optimizer.zero_grad()
        accelerator.backward(F.cross_entropy(model(x), y))
        optimizer.step()


def steps_the_original_optimizer(accelerator, model, optimizer, loader, epochs):
    prepared_model, prepared_optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for epoch in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            accelerator.backward(F.cross_entropy(prepared_model(x), y))
            optimizer.step()


def own_accelerator(accelerator, model, optimizer, loader, epochs):  # a learner's own, not the given one
    from accelerate import Accelerator
    mine = Accelerator(cpu=True)
    model, optimizer, loader = mine.prepare(model, optimizer, loader)
    for epoch in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            mine.backward(F.cross_entropy(model(x), y))
            optimizer.step()


def notebook_global(accelerator, model, optimizer, loader, epochs):  # a name the processes lack
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for epoch in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            accelerator.backward(cross_entropy(model(x), y))  # noqa: F821
            optimizer.step()


def todo(accelerator, model, optimizer, loader, epochs):
    raise NotImplementedError


WRONG = [(no_prepare, "different weights|never prepared"),
         (loader_not_prepared, "every process saw all the data"),
         (model_not_prepared, "different weights"),
         (optimizer_not_prepared, "optimizer was not prepared"),
         (plain_backward, r"not accelerator.backward\(loss\)"),
         (own_accelerator, "made an Accelerator of its own and trained with it"),
         (one_epoch_only, "fewer than its share"),
         (steps_the_original_optimizer, "stepped the original one"),
         (notebook_global, r"NameError: name 'cross_entropy' is not defined: a name defined nowhere \(a typo\?\)")]


@pytest.fixture(scope="module")
def reports():
    fns = [nb16_frameworks.accelerate_loop, prepared_in_two_calls, right_in_other_words, todo] + [fn for fn, _ in WRONG]
    return dict(zip([fn.__name__ for fn in fns], exercises.run_loops(fns)))


@pytest.mark.parametrize("name", ["accelerate_loop", "prepared_in_two_calls", "right_in_other_words"])
def test_right_answers_pass(reports, name):
    verdict = exercises.judge(reports[name])
    assert verdict.startswith("correct") and "2 processes" in verdict


def test_unfinished_answer_is_reported(reports):
    with pytest.raises(NotImplementedError, match="not done yet"):
        exercises.judge(reports["todo"])


@pytest.mark.parametrize("wrong, message", WRONG, ids=[fn.__name__ for fn, _ in WRONG])
def test_wrong_answers_fail(reports, wrong, message):
    with pytest.raises(AssertionError, match=message):
        exercises.judge(reports[wrong.__name__])


def test_a_name_of_the_notebook_is_named_as_such(reports):
    """The same NameError, when the learner's notebook defines the name: import it inside."""
    with pytest.raises(AssertionError, match="`cross_entropy` is defined in the notebook, .*inside the function"):
        exercises.judge(reports["notebook_global"], notebook_names={"cross_entropy", "F"})


def test_the_notebooks_check_passes_the_reference(reports, monkeypatch, capsys):
    """check_accelerate_loop itself (its probe, its print, its return) on a finished answer, fed
    the report of the reference's run above instead of a launch of its own."""
    monkeypatch.setattr(exercises, "run_loops", lambda fns: [reports["accelerate_loop"]])
    verdict = exercises.check_accelerate_loop(nb16_frameworks.accelerate_loop)
    assert verdict.startswith("correct") and capsys.readouterr().out.strip() == verdict
