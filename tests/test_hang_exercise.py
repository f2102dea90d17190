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


def late_save_on_rank_0(epoch, correct, seen, path):
    """Right, but in the check's first run rank 0 reaches save_checkpoint late: only once rank 1
    has given up waiting in its barrier (rank 1 writes its report then), as when a busy machine
    stalls rank 0's torch.save past the timeout. Later runs (HANG_TEST_STALLED exists) are not late."""
    import os
    import time
    totals = torch.tensor([correct, seen], dtype=torch.float64)
    dist.all_reduce(totals)
    accuracy = (totals[0] / totals[1]).item()
    stalled = os.environ["HANG_TEST_STALLED"]
    if dist.get_rank() == 0 and not os.path.exists(stalled):
        open(stalled, "w").close()
        while not os.path.exists(os.path.join(os.path.dirname(path), "rank1.json")):
            time.sleep(0.05)
    save_checkpoint(path, {"epoch": epoch, "accuracy": accuracy})
    return accuracy


def _count_runs(monkeypatch) -> list:
    """The collective timeouts of the check's runs, in order."""
    timeouts, spawn = [], ex.spawn

    def counted(*args, **kwargs):
        timeouts.append(kwargs["collective_timeout_s"])
        return spawn(*args, **kwargs)
    monkeypatch.setattr(ex, "spawn", counted)
    return timeouts


@pytest.mark.parity
@pytest.mark.parametrize("name", list(WRONG))
def test_each_typical_wrong_answer_is_named(name, monkeypatch):
    fn, pattern = WRONG[name]
    timeouts = _count_runs(monkeypatch)
    start = time.monotonic()
    with pytest.raises(AssertionError, match=pattern):
        ex.check_end_of_epoch(fn)
    assert timeouts[0] == ex.TIMEOUT_S
    # the timeouts reached init_process_group: gloo's default (30 min) would wait far longer
    assert time.monotonic() - start < 600


@pytest.mark.parity
def test_a_late_rank_is_not_called_a_hang(monkeypatch, tmp_path):
    monkeypatch.setenv("HANG_TEST_STALLED", str(tmp_path / "stalled"))
    timeouts = _count_runs(monkeypatch)
    assert ex.check_end_of_epoch(late_save_on_rank_0).startswith("correct")
    # the first run timed out (rank 0 waited for rank 1's report of it), the second judged
    assert (tmp_path / "stalled").exists() and timeouts == [ex.TIMEOUT_S, ex.LONG_TIMEOUT_S]


def _epoch(*calls, error=False, value=None) -> dict:
    rec = {"calls": [{"op": op, "caller": "f", "done": done} for op, done in calls]}
    rec.update({"error": "RuntimeError: timeout"} if error else {"value": value})
    return rec


def test_which_records_prove_a_hang_and_which_could_be_a_late_rank():
    done, ok = ("all_reduce", True), _epoch(("all_reduce", True), ("barrier", True), value=0.6)
    waits_all_reduce = _epoch(("all_reduce", False), error=True)
    waits_barrier = _epoch(done, ("barrier", False), error=True)
    proven = {  # the typical wrong answers' records: what the recorders see, at any speed
        "returned without joining": {0: [waits_all_reduce], 1: [_epoch(value=0.2), _epoch(value=0.1)]},
        "returned after fewer": {0: [waits_barrier], 1: [_epoch(done, value=0.6), _epoch(done, value=0.6)]},
        "different collectives": {0: [waits_all_reduce], 1: [_epoch(("barrier", False), error=True)]},
        "an error outside collectives": {0: [_epoch(done, error=True)], 1: [waits_barrier]},
    }
    late = {  # a correct answer whose rank 0 was late to save_checkpoint's barrier
        "both in the same collective": {0: [waits_barrier], 1: [waits_barrier]},
        "the late rank's barrier completed": {0: [ok, _epoch(("all_reduce", False), error=True)],
                                              1: [waits_barrier]},
        "a report missing": {1: [waits_barrier]},
    }
    assert [n for n, r in proven.items() if ex.late_rank_possible(r)] == []
    assert [n for n, r in late.items() if not ex.late_rank_possible(r)] == []


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
        if not seen:  # the first run (no report: the check runs it again with the long timeout)
            seen.update(kwargs, world=world)
        raise ex.ProcessesFailed("rank 0: stopped")
    monkeypatch.setattr(ex, "spawn", fake_spawn)
    with pytest.raises(AssertionError):
        ex.check_end_of_epoch(ex.end_of_epoch_broken)
    assert seen["device"] == "cpu" and seen["world"] == 2 and seen["collective_timeout_s"] == ex.TIMEOUT_S
