"""Own naive / GPipe / 1F1B and torch.distributed.pipelining's schedules equal the unsplit model."""
import pytest

from source_code.pipeline import harness, library, simulator
from source_code.pipeline.formulas import stored_microbatches
from source_code.processes import spawn


def _check(per_rank, p, m):
    by_schedule = {}
    for rows in zip(*per_rank):
        name = rows[0]["schedule"]
        by_schedule[name] = rows
        tol = rows[0]["tol"]
        assert tol == harness.TOL == 1e-6 and "on cpu" in rows[0]["tol_why"]  # the CPU's fp32 tolerance
        assert max(r["grad_diff"] for r in rows) <= tol, name
        losses = [r["loss_diff"] for r in rows if r["loss_diff"] is not None]
        assert len(losses) == 1 and losses[0] <= tol, name
        if name in simulator.SCHEDULES:
            mm = 1 if name == "naive" else m
            for s, r in enumerate(rows):  # the processes ran the simulator's orders
                assert [tuple(op) for op in r["order"]] == simulator.stage_order(name, p, mm, s)
                assert r["peak_in_flight"] == stored_microbatches(name, p, mm, s)
    return by_schedule


@pytest.mark.parity
def test_all_schedules_p2():
    p, m = 2, 4
    per_rank = spawn(harness.all_parity, p, m, harness.Workload(layers=4))
    rows = _check(per_rank, p, m)
    assert set(rows) == set(simulator.SCHEDULES) | set(library.available())
    # 1F1B keeps fewer activation bytes than GPipe on every stage (m = 4 > p - s)
    for s in range(p):
        assert rows["1f1b"][s]["peak_bytes"] < rows["gpipe"][s]["peak_bytes"]


@pytest.mark.parity
@pytest.mark.slow
def test_schedules_p4():
    p, m = 4, 8
    names = list(simulator.SCHEDULES) + [n for n in library.available() if n != "lib-zero-bubble"]
    per_rank = spawn(harness.all_parity, p, m, harness.Workload(layers=8, dim=32), names)
    rows = _check(per_rank, p, m)
    assert [r["peak_in_flight"] for r in rows["1f1b"]] == [4, 3, 2, 1]
    assert [r["peak_in_flight"] for r in rows["gpipe"]] == [8, 8, 8, 8]
