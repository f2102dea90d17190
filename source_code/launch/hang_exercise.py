"""Notebook 06's exercise: find and fix the hang in an end-of-epoch routine.

    from source_code.launch.hang_exercise import check_end_of_epoch, save_checkpoint
    check_end_of_epoch(end_of_epoch)        # 2 processes, a 3-second collective timeout

``end_of_epoch(epoch, correct, seen, path)`` is called on every rank at the end of each epoch
with that rank's own counts. It must return the accuracy over ALL ranks' samples (the same
number on every rank) and save ``{"epoch": epoch, "accuracy": accuracy}`` to ``path`` with
``save_checkpoint``, whose docstring says who must call it. The check runs it on 2 processes
with a short collective timeout and names, in one line, the collective each rank was waiting
in when it hung (and which function called it), a wrong value, or a correct answer. A run whose
records could also be a rank that was only late (a busy machine) runs again with a long timeout
before it is called a hang.

The function travels to the processes as source text (a function defined in a notebook cell
cannot be pickled), so it must be self-contained: it may use ``torch``, ``dist`` and
``save_checkpoint``. Reference solution: ``source_code/solutions/nb06_hang.py``.

The check runs on the CPU with gloo on every machine (``spawn(..., device="cpu")``), also on
a GPU node, on purpose: the learner's function all-reduces CPU tensors, which go through gloo
in the GPU nodes' mixed group ``cpu:gloo,cuda:nccl``, while ``save_checkpoint``'s
``dist.barrier()`` would go through NCCL. A hang would then be one rank waiting in gloo and
the other in NCCL, whose watchdog aborts the process at the timeout instead of raising: no
per-rank report, no verdict. On gloo both ranks raise after the timeout and say where they were.
"""
from __future__ import annotations

import functools
import inspect
import io
import json
import os
import sys
import tempfile
import textwrap

import torch
import torch.distributed as dist

from source_code.processes import ProcessesFailed, spawn

# (correct, seen) of rank 0 and rank 1 in each epoch: the shards differ in size
CASES = [((30, 40), (2, 10)), ((45, 50), (3, 30))]
TIMEOUT_S = 3.0
# a second run's timeout, when the first run's records cannot tell a hang from a late rank
LONG_TIMEOUT_S = 60.0
COLLECTIVES = ("all_reduce", "barrier", "broadcast", "all_gather", "all_gather_object", "gather",
               "gather_object", "reduce", "scatter", "reduce_scatter", "broadcast_object_list",
               "all_to_all", "send", "recv", "monitored_barrier")


def save_checkpoint(path, state):
    """Every rank calls this: rank 0 writes ``state`` to ``path``, then all ranks wait in a
    barrier, so that no rank goes on (or reads the file) before it is complete."""
    if dist.get_rank() == 0:
        torch.save(state, path + ".tmp")
        os.replace(path + ".tmp", path)  # a reader never sees half a file
    dist.barrier()


def end_of_epoch_broken(epoch, correct, seen, path):
    """The learner's starting point (the cell of notebook 06 shows the same code)."""
    accuracy = correct / seen                         # this rank's own accuracy
    if dist.get_rank() == 0:                          # report and save once, on rank 0
        totals = torch.tensor([correct, seen], dtype=torch.float64)
        dist.all_reduce(totals)                       # the counts of all ranks
        accuracy = (totals[0] / totals[1]).item()
        print(f"epoch {epoch}: accuracy {accuracy:.3f}")
        save_checkpoint(path, {"epoch": epoch, "accuracy": accuracy})
    return accuracy


def expected() -> list[float]:
    return [(a[0] + b[0]) / (a[1] + b[1]) for a, b in CASES]


# --------------------------------------------------------------------------- on each rank
def _trace_collectives(current: dict) -> None:
    """Wrap torch.distributed's collectives in this (spawned) process: each call is appended to
    ``current["log"]`` with the function that made it, and marked done when it returns."""
    for name in COLLECTIVES:
        original = getattr(dist, name, None)
        if original is None:
            continue

        def traced(*args, _original=original, _name=name, **kwargs):
            entry = {"op": _name, "caller": sys._getframe(1).f_code.co_name, "done": False}
            current["log"].append(entry)
            out = _original(*args, **kwargs)
            entry["done"] = True
            return out
        setattr(dist, name, functools.wraps(original)(traced))


def _run_on_rank(source: str, name: str, workdir: str) -> list:
    """Runs on each spawned rank: the learner's function once per epoch of CASES; what
    happened is written to ``workdir/rank<r>.json`` (also when a collective times out)."""
    rank = dist.get_rank()
    namespace = {"torch": torch, "dist": dist, "save_checkpoint": save_checkpoint}
    exec(source, namespace)
    fn, epochs, current = namespace[name], [], {}
    report = os.path.join(workdir, f"rank{rank}.json")
    _trace_collectives(current)
    for epoch, per_rank in enumerate(CASES):
        current["log"] = []
        epochs.append({"calls": current["log"]})
        correct, seen = per_rank[rank]
        try:
            epochs[-1]["value"] = float(fn(epoch, correct, seen, os.path.join(workdir, "checkpoint.pt")))
        except Exception as exc:
            first = str(exc).splitlines()[0][:200] if str(exc) else ""
            epochs[-1]["error"] = f"{type(exc).__name__}: {first}"
            with open(report, "w") as f:
                json.dump(epochs, f)
            sys.stderr = io.StringIO()  # the check says it in one line: no traceback wall
            raise RuntimeError(f"rank {rank} stopped at epoch {epoch}") from None
    with open(report, "w") as f:
        json.dump(epochs, f)
    # If the other rank is stuck, the clean-up barrier of the harness times out here too; the
    # report file says what happened, so keep that second traceback off the learner's screen.
    sys.stderr = io.StringIO()
    return [e["value"] for e in epochs]


# --------------------------------------------------------------------------- the verdict
def _where(rank: int, record: dict) -> str:
    calls = record["calls"]
    pending = [c for c in calls if not c["done"]]
    if pending:
        c = pending[-1]
        return f"rank {rank} waited in {c['op']} (called from {c['caller']}, its collective #{len(calls)})"
    made = ", ".join(f"{c['op']} in {c['caller']}" for c in calls)
    return f"rank {rank} did not join it: it returned after {len(calls)} collective(s){f' ({made})' if made else ''}"


def verdict(reports: dict, timeout_s: float, failure: str = "") -> str:
    """One line from the ranks' reports: 'hang: ...', 'error: ...' or '' (nothing went wrong)."""
    if len(reports) < 2 and failure:
        return f"error: the function failed on the processes: {failure.strip().splitlines()[-1][:300]}"
    epoch = _first_failed_epoch(reports)
    if epoch is None:
        return ""
    records = {rank: r[epoch] for rank, r in reports.items() if epoch < len(r)}
    for rank, rec in sorted(records.items()):
        if "error" in rec and all(c["done"] for c in rec["calls"]):
            return f"error: rank {rank} at epoch {epoch}: {rec['error']}"
    waiting = {rank: rec["calls"][-1]["op"] for rank, rec in records.items()
               if rec["calls"] and not rec["calls"][-1]["done"]}
    where = "; ".join(_where(rank, rec) for rank, rec in sorted(records.items()))
    if len(waiting) == 2 and len(set(waiting.values())) == 2:
        hint = ("the ranks were in different collectives at the same moment: every rank must make "
                "the same collective calls in the same order")
    else:
        hint = ("a collective returns only when every rank of the group has called it; look for "
                "collectives, also inside the helpers you call, that only some ranks reach")
    return f"hang at epoch {epoch} (timeout {timeout_s:g} s): {where}. Hint: {hint}"


# float32 arithmetic is a correct answer too: torch.tensor([correct, seen]) holds int64, whose
# division gives float32 (0.64 comes back as 0.6399999857); the wrong answers differ by far more
TOLERANCE = 1e-6


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= TOLERANCE * max(1.0, abs(b))


def _value_problem(got: list) -> str:
    want = expected()
    for rank, values in enumerate(got):
        for epoch, (g, w) in enumerate(zip(values, want)):
            if not _close(g, w):
                (c0, s0), (c1, s1) = CASES[epoch]
                own = CASES[epoch][rank][0] / CASES[epoch][rank][1]
                why = ("that is this rank's own accuracy" if _close(g, own) else
                       "that is the mean of the ranks' accuracies, which weighs a rank with few "
                       "samples like one with many" if _close(g, (c0 / s0 + c1 / s1) / 2) else
                       "count correct answers and samples over all ranks")
                return (f"wrong value at epoch {epoch} on rank {rank}: {g:.4f}, the accuracy over "
                        f"all samples is {w:.4f} ({why})")
    return ""


def _first_failed_epoch(reports: dict) -> int | None:
    failed = [e for e in range(len(CASES)) if any(e < len(r) and "error" in r[e] for r in reports.values())]
    return failed[0] if failed else None


def late_rank_possible(reports: dict) -> bool:
    """Could a run that failed be a correct answer whose ranks were only late (a busy machine:
    rank 0's torch.save stalled past the timeout while rank 1 waited in the barrier)?

    The records prove a wrong answer when, in the first epoch that failed, a rank raised outside
    any collective, or both ranks waited at the same position of their calls in different
    collectives, or one rank waited in its collective #k while the other finished the epoch with
    fewer than k: no wait makes those right. Anything else can be lateness: both ranks waiting in
    the same collective (the late one got there after the other had given up), the late one a
    collective further on (on gloo a collective the other rank had already sent its share of can
    complete after that rank has given up), or a report missing (the late rank was stopped
    before it could write it)."""
    epoch = _first_failed_epoch(reports)
    if len(reports) < 2:
        return True
    if epoch is None or any(epoch >= len(r) for r in reports.values()):
        return epoch is not None
    records = [r[epoch] for r in reports.values()]
    if any("error" in rec and all(c["done"] for c in rec["calls"]) for rec in records):
        return False
    pending = [(len(rec["calls"]), rec["calls"][-1]["op"]) for rec in records
               if rec["calls"] and not rec["calls"][-1]["done"]]
    if len(pending) == 2:
        (k0, op0), (k1, op1) = pending
        return not (k0 == k1 and op0 != op1)
    returned = [len(rec["calls"]) for rec in records if not rec["calls"] or rec["calls"][-1]["done"]]
    return not (pending and returned and returned[0] < pending[0][0])


def _run(source: str, name: str, timeout_s: float) -> tuple:
    """One run of the learner's function on 2 processes: (failure, values, reports, checkpoint)."""
    with tempfile.TemporaryDirectory(prefix="hang-exercise-") as workdir:
        failure, got = "", None
        try:
            got = spawn(_run_on_rank, 2, source, name, workdir, device="cpu", timeout=60 + timeout_s,
                        collective_timeout_s=timeout_s)
        except ProcessesFailed as err:
            failure = str(err)
        reports = {}
        for rank in range(2):
            path = os.path.join(workdir, f"rank{rank}.json")
            if os.path.exists(path):
                with open(path) as f:
                    reports[rank] = json.load(f)
        ckpt = os.path.join(workdir, "checkpoint.pt")
        state = torch.load(ckpt) if os.path.exists(ckpt) else None
    return failure, got, reports, state


def check_end_of_epoch(fn, timeout_s: float = TIMEOUT_S) -> str:
    """Run ``fn`` on 2 processes for the epochs of CASES; raise AssertionError with a one-line
    verdict if it hangs, fails, returns a wrong accuracy or saves a wrong checkpoint.

    A short timeout makes a hang quick to see, but a busy machine can hold a rank up for as long
    (the verdict would call a correct answer a hang): when the records of a failed run could be
    a late rank (``late_rank_possible``), it runs once more with LONG_TIMEOUT_S and judges that
    run. A real hang hangs again and is named from the second run's records."""
    source = textwrap.dedent(inspect.getsource(fn))
    failure, got, reports, state = _run(source, fn.__name__, timeout_s)
    if failure and late_rank_possible(reports) and LONG_TIMEOUT_S > timeout_s:
        print(f"note: after {timeout_s:g} s the ranks' records cannot tell a hang from a late rank; "
              f"running again with a {LONG_TIMEOUT_S:g} s timeout", flush=True)
        timeout_s = LONG_TIMEOUT_S
        failure, got, reports, state = _run(source, fn.__name__, timeout_s)
    problem = verdict(reports, timeout_s, failure) if failure else ""
    if not problem and got is None:  # both ranks returned, but the processes ended badly
        if len(reports) < 2:
            problem = f"error: the processes failed: {failure.strip().splitlines()[-1][:300]}"
        else:
            got = [[e["value"] for e in reports[r]] for r in range(2)]
    if not problem:
        problem = _value_problem(got)
    if not problem:
        last = len(CASES) - 1
        if state is None:
            problem = "no checkpoint: save it with save_checkpoint(path, {...}) (read its docstring)"
        elif state.get("epoch") != last or not _close(float(state.get("accuracy", -1)), expected()[last]):
            problem = (f"wrong checkpoint: it holds {state}, expected epoch {last} with accuracy "
                       f"{expected()[last]:.4f}")
    if problem:
        raise AssertionError(problem)
    return ("correct: no hang; both ranks return the accuracy over all samples "
            f"({', '.join(f'{w:.3f}' for w in expected())}) and the checkpoint is saved")
