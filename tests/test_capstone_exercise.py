"""Notebook 19's exercise: the check passes the reference and a correct answer written another
way, and names what typical wrong answers miss, in one line each (one set of 4 processes for all
of them); the report tool shows which parameters of the handed step differ.

    .venv/bin/python -m pytest tests/test_capstone_exercise.py -q
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from source_code.capstone import exercises, runners_3d
from source_code.capstone.cp_model import cp_logits, my_tokens
from source_code.capstone.loss import global_token_count, global_token_loss, local_token_count
from source_code.capstone.runner import piece
from source_code.context_parallel.comm import Ring
from source_code.solutions.nb19_capstone import train_step


def _groups(mesh):
    return [mesh["dp"].get_group(), mesh["cp"].get_group()]


def _forward(model, x, y, mesh, world_count=False, local_count=False):
    ring = Ring(mesh["cp"].get_group())
    xs, ys = piece((x, y), mesh["dp"].get_local_rank(), mesh["dp"].size())
    ys = my_tokens(ys, ring)
    count = (local_token_count([ys]) if local_count else
             global_token_count([ys]) if world_count else global_token_count([ys], _groups(mesh)))
    loss = global_token_loss(cp_logits(model, xs, ring), ys, count)
    loss.backward()
    return loss


def one_flat_all_reduce(model, x, y, mesh):       # correct, written another way
    loss = _forward(model, x, y, mesh)
    grads = [p.grad for p in model.parameters()]
    flat = torch.cat([g.flatten() for g in grads])
    for group in _groups(mesh):
        dist.all_reduce(flat, group=group)
    for g, part in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(part.view_as(g))
    return loss


def count_over_world(model, x, y, mesh):          # the reductions right, the count over all ranks
    loss = _forward(model, x, y, mesh, world_count=True)
    for p in model.parameters():
        for group in _groups(mesh):
            dist.all_reduce(p.grad, group=group)
    return loss


def over_world(model, x, y, mesh):                # count and gradients over every rank of the job
    loss = _forward(model, x, y, mesh, world_count=True)
    for p in model.parameters():
        dist.all_reduce(p.grad)
    return loss


def over_dp_only(model, x, y, mesh):
    loss = _forward(model, x, y, mesh)
    for p in model.parameters():
        dist.all_reduce(p.grad, group=mesh["dp"].get_group())
    return loss


def over_cp_only(model, x, y, mesh):
    loss = _forward(model, x, y, mesh)
    for p in model.parameters():
        dist.all_reduce(p.grad, group=mesh["cp"].get_group())
    return loss


def averaged(model, x, y, mesh):
    loss = _forward(model, x, y, mesh)
    for p in model.parameters():
        for group in _groups(mesh):
            dist.all_reduce(p.grad, group=group)
        p.grad /= dist.get_world_size()
    return loss


def local_count(model, x, y, mesh):               # each rank divides by its own tokens
    loss = _forward(model, x, y, mesh, local_count=True)
    for p in model.parameters():
        for group in _groups(mesh):
            dist.all_reduce(p.grad, group=group)
    return loss


def returns_nothing(model, x, y, mesh):          # the gradients right, no loss returned
    train_step(model, x, y, mesh)


def returns_rank_mean(model, x, y, mesh):         # the gradients right, a per-rank mean returned
    return train_step(model, x, y, mesh) * mesh["dp"].size() * mesh["cp"].size()


def not_context_parallel(model, x, y, mesh):     # the gradients right, but every cp rank runs its samples whole
    xs, ys = piece((x, y), mesh["dp"].get_local_rank(), mesh["dp"].size())
    count = global_token_count([ys], mesh["dp"].get_group())
    loss = global_token_loss(model(xs), ys, count) / mesh["cp"].size()
    loss.backward()
    for p in model.parameters():
        for group in _groups(mesh):
            dist.all_reduce(p.grad, group=group)
    return loss


def raises(model, x, y, mesh):
    raise RuntimeError("forgot the groups")


HELPERS = """
import torch.distributed as dist

from source_code.capstone.cp_model import cp_logits, my_tokens
from source_code.capstone.loss import global_token_loss
from source_code.capstone.runner import piece
from source_code.context_parallel.comm import Ring

import functools

TOKEN_DIMS = ["dp", "cp"]
SKIP = {"dims": set()}


def add_over(tensor, mesh, dims):
    for dim in dims:
        if dim not in SKIP["dims"]:
            dist.all_reduce(tensor, group=mesh[dim].get_group())
    return tensor


add_all = functools.partial(add_over, dims=TOKEN_DIMS)


def train_step(model, x, y, mesh):
    ring = Ring(mesh["cp"].get_group())
    xs, ys = piece((x, y), mesh["dp"].get_local_rank(), mesh["dp"].size())
    ys = my_tokens(ys, ring)
    loss = global_token_loss(cp_logits(model, xs, ring), ys, add_all((ys != -100).sum(), mesh))
    loss.backward()
    for p in model.parameters():
        add_all(p.grad, mesh)
    return loss
"""


def _notebook_cell(tmp_path, source, name="cell.py"):
    """``train_step`` of ``source`` run as a notebook cell would run it (module "__main__")."""
    path = tmp_path / name
    path.write_text(source)
    namespace = {"__name__": "__main__"}
    exec(compile(source, str(path), "exec"), namespace)
    return namespace["train_step"]


def notebook_function(tmp_path):
    """A correct step written as a notebook would: a helper function, a partial of it, a list
    and a dict of sets defined beside it (module "__main__", nothing importable)."""
    return _notebook_cell(tmp_path, HELPERS)


def test_reference_passes_and_wrong_answers_are_named(tmp_path):
    got = exercises.diagnose([train_step, one_flat_all_reduce, notebook_function(tmp_path),
                              exercises.handed_step, over_dp_only, over_cp_only, averaged,
                              local_count, raises, count_over_world, over_world,
                              returns_nothing, returns_rank_mean, not_context_parallel])
    for ok, line in got[:3]:
        assert ok and line.startswith("correct"), line
    expected = [("wrong where it is", "every parameter but layers.*.attn.wk.weight"),
                ("wrong where it is", "every parameter;"), ("on its own samples alone",),
                ("divided by the number of ranks",), ("on every mesh",), ("forgot the groups",),
                ("inside a larger job", "0.5 x one process's"),
                ("inside a larger job", "hold gradients of other weights"),
                ("returned losses do not add up",), ("returned losses do not add up",),
                ("every gradient is right", "2 x 2 mesh", "2 x the batch's tokens")]
    for (ok, line), words in zip(got[3:], expected, strict=True):
        assert not ok and "\n" not in line and all(w in line for w in words), (words, line)


def test_report_shows_which_gradients_of_the_handed_step_differ(capsys):
    report = exercises.gradient_report(exercises.handed_step)
    lines = exercises.show_report(report)
    differs = {ln.split()[0] for ln in lines[1:] if ln.endswith("differs")}
    same = {ln.split()[0] for ln in lines[1:] if ln.endswith("same")}
    assert {"tok.weight", "head.weight", "layers.*.mlp.up.weight"} <= differs, lines
    assert {"layers.*.attn.wq.weight", "layers.*.attn.wo.weight"} <= same, lines


def test_unfinished_exercise_says_so_in_one_line():
    def train_step(model, x, y, mesh):
        raise NotImplementedError
    line = exercises.check_train_step(train_step)
    assert line.startswith("not done yet") and "\n" not in line, line


def test_portable_carries_plain_values_and_partials_not_notebook_objects(tmp_path):
    from source_code.capstone.portable import portable, rebuild
    fn = notebook_function(tmp_path)
    source, name, found = portable(fn)
    kinds = {key: what[0] for key, what in found.items()}
    assert kinds["SKIP"] == "value" and kinds["add_all"] == "partial", kinds   # a dict of a set; a partial
    assert kinds["add_over"] == "source" and kinds["dist"] == "module" and kinds["piece"] == "attr", kinds
    again = rebuild(source, name, found)
    assert again.__globals__["add_all"].keywords == {"dims": ["dp", "cp"]}
    namespace = {"__name__": "__main__"}
    path = tmp_path / "cls.py"
    path.write_text("class Box:\n    pass\n\nBOX = Box()\n\ndef f():\n    return BOX\n")
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    assert "BOX" not in portable(namespace["f"])[2]      # an object of the notebook's own class


def test_a_forward_recomputed_in_the_backward_is_not_counted_again():
    """A right step that checkpoints its activations runs the MLPs' forward again in the
    backward: those tokens ran already, and the count keeps them once."""
    from torch import nn
    from torch.utils.checkpoint import checkpoint
    model = nn.Module()
    model.layers = nn.ModuleList([nn.Module()])
    model.layers[0].mlp = nn.Linear(4, 4)
    model.head = nn.Linear(4, 3)
    x = torch.randn(2, 5, 4, requires_grad=True)
    for reentrant in (False, True):   # torch's two ways of recomputing
        rows = exercises.count_rows(model)
        block = lambda t: torch.tanh(model.layers[0].mlp(torch.tanh(t)))   # noqa: E731  an inner tensor to recompute
        h = checkpoint(block, x, use_reentrant=reentrant)
        model.head(h).sum().backward()
        assert rows == {"layers.0.mlp": 10, "head": 10}, (reentrant, rows)


def notebook_13s_step(model, x, y, mesh):        # the finished step of notebook 13, called
    from source_code.context_parallel import model_step
    return model_step.train_step(model, x, y, model_step.mesh_groups(mesh["dp"].size(), mesh["cp"].size()))


def the_matrixs_runner(model, x, y, mesh):       # the matrix's DP x TP x CP runner, through a global
    return runners_3d.dp_tp_cp(model, dp=mesh["dp"].size(), tp=1, cp=mesh["cp"].size())


THROUGH_A_HELPER = """
def finished(model, x, y, mesh):
    from source_code.context_parallel import model_step
    return model_step.train_step(model, x, y, model_step.mesh_groups(mesh["dp"].size(), mesh["cp"].size()))


def train_step(model, x, y, mesh):
    return finished(model, x, y, mesh)
"""


def test_a_step_that_reaches_a_finished_one_is_turned_away_before_any_process_starts(tmp_path):
    from source_code.capstone.portable import portable, reaches
    for fn, name in ((notebook_13s_step, "model_step"), (the_matrixs_runner, "runners_3d"),
                     (_notebook_cell(tmp_path, THROUGH_A_HELPER, "helper_cell.py"), "model_step"), (train_step, "train_step")):
        line = exercises.check_train_step(fn, show=False)
        assert line.startswith("not yet: your step reaches a finished one") and name in line, line
    own = notebook_function(tmp_path)                          # right answers of the learner's own
    for fn in (own, one_flat_all_reduce):
        assert reaches(fn, portable(fn)[2], exercises.READY_STEPS) == [], fn
