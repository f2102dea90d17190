"""Check functions for notebook 10's exercise (reference solution: source_code/solutions/nb10_pipeline.py).

    from source_code.pipeline.exercises import check_1f1b_order, run_for_real
    check_1f1b_order(my_order)      # against the simulator, for p = 2..4 and m = 1..8
    run_for_real(my_order)          # then 2 real processes execute your orders

``my_order(p, m, s)`` returns stage s's operations, e.g. [("F", 0), ("F", 1), ("B", 0), ...].
A wrong answer raises AssertionError with what is wrong and a hint; an unfinished one
(NotImplementedError) says so.
"""
from __future__ import annotations

from source_code.pipeline import simulator
from source_code.pipeline.formulas import stored_microbatches

CASES = [(p, m) for p in (2, 3, 4) for m in range(1, 9)]


def _orders(fn, p: int, m: int):
    return [[(str(k), int(i)) for k, i in fn(p, m, s)] for s in range(p)]


def check_1f1b_order(fn) -> str:
    """``fn(p, m, s)`` must give 1F1B's order of stage s: a valid order, no deadlock, at most
    min(p - s, m) stored microbatches, and as fast as 1F1B in the simulator (F=1, B=2)."""
    try:
        fn(2, 2, 0)
    except NotImplementedError:
        raise NotImplementedError("exercise not done yet: fill in the order, then run this cell again") from None
    for p, m in CASES:
        got = _orders(fn, p, m)
        where = f"p={p}, m={m}"
        try:
            simulator.validate(got, m)
        except ValueError as err:
            raise AssertionError(f"{where}: {err}. Hint: every stage runs each forward and each "
                                 "backward once, microbatch 0 first") from None
        try:
            timeline = simulator.simulate(got, fwd=1, bwd=2)
        except simulator.Deadlock as err:
            raise AssertionError(f"{where}: {err}. Hint: a stage must not wait for a gradient of "
                                 "microbatch i before it has sent forward everything the next stage "
                                 "needs to reach B i; count the warm-up forwards from the LAST stage "
                                 "(it needs none)") from None
        for s, order in enumerate(got):
            held, limit = simulator.peak_in_flight(order), stored_microbatches("1f1b", p, m, s)
            assert held <= limit, (
                f"{where}, stage {s}: holds {held} microbatches' activations at once, 1F1B holds at "
                f"most {limit}. Hint: after the warm-up forwards, alternate one forward and one "
                f"backward so a backward frees a microbatch before the next forward stores one")
        want = simulator.orders("1f1b", p, m)
        best = simulator.step_time(simulator.simulate(want, fwd=1, bwd=2))
        took = simulator.step_time(timeline)
        assert took <= best, (
            f"{where}: valid and within the memory bound, but the step takes {took:g} units instead "
            f"of 1F1B's {best:g} (F=1, B=2): the pipeline runs dry. Hint: stage s needs p - s - 1 "
            "warm-up forwards to keep the later stages busy")
        for s in range(p):
            assert got[s] == want[s], (
                f"{where}, stage {s}: {_fmt(got[s])} is as fast, but 1F1B's order is {_fmt(want[s])}. "
                "Hint: in the steady state the forward comes before the backward")
    msg = f"correct: your 1F1B orders match the simulator's for p = 2..4, m = 1..8 ({len(CASES)} cases)"
    print(msg)
    return msg


def _fmt(order) -> str:
    return " ".join(f"{k}{i}" for k, i in order)


def run_for_real(fn, p: int = 2, m: int = 4) -> dict:
    """Run ``fn``'s orders on p real processes (gloo), one step of the TransformerLM, and compare
    with the unsplit model. Returns the executed orders, stored microbatches, max diffs and the
    tolerance they must stay within (``tol``: harness.TOL on the CPU)."""
    from source_code.pipeline.harness import Workload, parity
    from source_code.processes import spawn
    orders = _orders(fn, p, m)  # computed here: a function from a notebook cell cannot be pickled
    per_rank = spawn(parity, p, "1f1b", m, Workload(), orders)
    return {"executed": [r["order"] for r in per_rank],
            "peak_in_flight": [r["peak_in_flight"] for r in per_rank],
            "grad_diff": max(r["grad_diff"] for r in per_rank),
            "loss_diff": max(r["loss_diff"] for r in per_rank if r["loss_diff"] is not None),
            "tol": per_rank[0]["tol"], "orders": orders}
