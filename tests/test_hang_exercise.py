"""Notebook 06's hang exercise: the reference solution passes; the original hang, two "fixes"
that deadlock differently and three that no longer hang but are wrong are each named."""
import inspect
import json
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from source_code.launch import hang_exercise as ex
from source_code.launch.hang_exercise import save_checkpoint
from source_code.solutions import nb06_hang

# The typical wrong answers, written as a learner would in the notebook cell (the check runs
# their source with torch, dist and save_checkpoint in scope, as imported here).


def moved_the_all_reduce_only(epoch, correct, seen, path):
    totals = torch.tensor([correct, seen], dtype=torch.float64)
    dist.all_reduce(totals)
    accuracy = (totals[0] / totals[1]).item()
    if dist.get_rank() == 0:
        save_checkpoint(path, {"epoch": epoch, "accuracy": accuracy})
    return accuracy


def a_barrier_for_the_others(epoch, correct, seen, path):
    accuracy = correct / seen
    if dist.get_rank() == 0:
        totals = torch.tensor([correct, seen], dtype=torch.float64)
        dist.all_reduce(totals)
        accuracy = (totals[0] / totals[1]).item()
        save_checkpoint(path, {"epoch": epoch, "accuracy": accuracy})
    else:
        dist.barrier()  # "wait for rank 0's save"
    return accuracy


def mean_of_accuracies(epoch, correct, seen, path):
    acc = torch.tensor([correct / seen], dtype=torch.float64)
    dist.all_reduce(acc)
    accuracy = acc.item() / dist.get_world_size()
    save_checkpoint(path, {"epoch": epoch, "accuracy": accuracy})
    return accuracy


def only_rank0_uses_the_sum(epoch, correct, seen, path):
    accuracy = correct / seen
    totals = torch.tensor([correct, seen], dtype=torch.float64)
    dist.all_reduce(totals)
    if dist.get_rank() == 0:
        accuracy = (totals[0] / totals[1]).item()
    save_checkpoint(path, {"epoch": epoch, "accuracy": accuracy})
    return accuracy


def forgot_the_checkpoint(epoch, correct, seen, path):
    totals = torch.tensor([correct, seen], dtype=torch.float64)
    dist.all_reduce(totals)
    return (totals[0] / totals[1]).item()


def in_int64_then_float32(epoch, correct, seen, path):
    """Right, written another way: the counts as int64, their quotient in float32."""
    totals = torch.tensor([correct, seen])
    dist.all_reduce(totals)
    accuracy = (totals[0] / totals[1]).item()
    save_checkpoint(path, {"epoch": epoch, "accuracy": accuracy})
    return accuracy


def in_float32(epoch, correct, seen, path):
    totals = torch.tensor([correct, seen], dtype=torch.float32)
    dist.all_reduce(totals)
    accuracy = (totals[0] / totals[1]).item()
    save_checkpoint(path, {"epoch": epoch, "accuracy": accuracy})
    return accuracy


WRONG = {
    "the original hang": (ex.end_of_epoch_broken,
                          r"^hang at epoch 0 .*rank 0 waited in all_reduce \(called from end_of_epoch_broken.*"
                          r"rank 1 did not join it: it returned after 0 collective"),
    "a different deadlock: the barrier of the save": (
        moved_the_all_reduce_only,
        r"^hang at epoch 0 .*rank 0 waited in barrier \(called from save_checkpoint, its collective #2\).*"
        r"rank 1 did not join it: it returned after 1 collective\(s\) \(all_reduce"),
    "a different deadlock: mismatched collectives": (
        a_barrier_for_the_others,
        r"^hang at epoch 0 .*rank 0 waited in all_reduce.*rank 1 waited in barrier.*different collectives"),
    "no hang, mean of accuracies": (mean_of_accuracies,
                                    r"^wrong value at epoch 0 on rank 0: .*mean of the ranks' accuracies"),
    "no hang, rank 1 keeps its own": (only_rank0_uses_the_sum,
                                      r"^wrong value at epoch 0 on rank 1: .*own accuracy"),
    "no hang, no checkpoint": (forgot_the_checkpoint, r"^no checkpoint"),
}


@pytest.mark.parity
def test_the_reference_solution_passes():
    assert ex.check_end_of_epoch(nb06_hang.end_of_epoch).startswith("correct")


@pytest.mark.parity
@pytest.mark.parametrize("fn", [in_int64_then_float32, in_float32])
def test_right_answers_in_float32_pass(fn):
    assert ex.check_end_of_epoch(fn).startswith("correct")


@pytest.mark.parity
@pytest.mark.parametrize("name", list(WRONG))
def test_each_typical_wrong_answer_is_named(name):
    fn, pattern = WRONG[name]
    start = time.monotonic()
    with pytest.raises(AssertionError, match=pattern):
        ex.check_end_of_epoch(fn)
    # spawn(collective_timeout_s=3) reached init_process_group: the default would wait minutes
    assert time.monotonic() - start < 30


def _function_body(text: str, name: str) -> list[str]:
    lines = text[text.index(f"def {name}("):].split("\n\n")[0].splitlines()[1:]
    return [ln.strip() for ln in lines if "TODO" not in ln and '"""' not in ln]


def test_the_notebook_starts_from_the_broken_version():
    nb = json.loads((Path(__file__).resolve().parents[1] / "notebooks/06_launching.ipynb").read_text())
    cell = next("".join(c["source"]) for c in nb["cells"] if "def end_of_epoch(" in "".join(c["source"]))
    assert _function_body(cell, "end_of_epoch") == _function_body(
        inspect.getsource(ex.end_of_epoch_broken), "end_of_epoch_broken")


def test_the_verdict_reads_the_ranks_reports():
    """Without processes: the one-line verdict built from two ranks' reports."""
    waiting = {"calls": [{"op": "barrier", "caller": "save_checkpoint", "done": False}], "error": "x"}
    returned = {"calls": [], "value": 0.2}
    text = ex.verdict({0: [waiting], 1: [returned]}, 3.0, "failed")
    assert text.startswith("hang at epoch 0 (timeout 3 s): rank 0 waited in barrier (called from save_checkpoint")
    assert ex.verdict({0: [returned], 1: [returned]}, 3.0, "failed") == ""


def test_check_runs_on_the_cpu_with_gloo_on_every_machine(monkeypatch):
    """On a GPU node the mixed group would send save_checkpoint's barrier through NCCL (an abort at
    the timeout, no verdict): the check asks for the CPU explicitly."""
    seen = {}

    def fake_spawn(fn, world, *args, **kwargs):
        seen.update(kwargs, world=world)
        raise ex.ProcessesFailed("rank 0: stopped")
    monkeypatch.setattr(ex, "spawn", fake_spawn)
    with pytest.raises(AssertionError):
        ex.check_end_of_epoch(ex.end_of_epoch_broken)
    assert seen["device"] == "cpu" and seen["world"] == 2 and seen["collective_timeout_s"] == ex.TIMEOUT_S
