"""The schedule simulator (pure Python): orders, timelines, the bubble and memory formulas."""
import pytest

from source_code.pipeline import simulator as sim
from source_code.pipeline.formulas import bubble_theory, step_time_theory, stored_microbatches

GRID = [(p, m) for p in (2, 3, 4) for m in range(1, 9)]


@pytest.mark.parametrize("p, m", GRID)
def test_orders_valid_and_bubble_matches_formula(p, m):
    for name in ("gpipe", "1f1b"):
        orders = sim.orders(name, p, m)
        sim.validate(orders, m)
        for fwd, bwd in ((1, 2), (1, 1), (3, 5)):
            tl = sim.simulate(orders, fwd, bwd)
            assert sim.step_time(tl) == pytest.approx(step_time_theory(p, m, fwd, bwd))
            assert sim.bubble_fraction(tl) == pytest.approx(bubble_theory(p, m))
        for s, order in enumerate(orders):
            assert sim.peak_in_flight(order) == stored_microbatches(name, p, m, s)


@pytest.mark.parametrize("p, m", GRID)
def test_1f1b_shape(p, m):
    for s in range(p):
        order = sim.one_f_one_b_order(p, m, s)
        warmup = min(p - s - 1, m)
        assert order[:warmup] == [("F", i) for i in range(warmup)]
        if m > warmup:   # steady state starts with the next forward, then the first backward
            assert order[warmup:warmup + 2] == [("F", warmup), ("B", 0)]
        else:
            assert order[warmup] == ("B", 0)
        assert order[-1] == ("B", m - 1)


def test_known_orders():
    assert sim.format_orders(sim.orders("1f1b", 3, 4)) == (
        "stage 0: F0 F1 F2 B0 F3 B1 B2 B3\n"
        "stage 1: F0 F1 B0 F2 B1 F3 B2 B3\n"
        "stage 2: F0 B0 F1 B1 F2 B2 F3 B3")
    assert sim.orders("naive", 2, 1) == [[("F", 0), ("B", 0)]] * 2


def test_timeline_of_gpipe_p2_m2():
    tl = sim.simulate(sim.orders("gpipe", 2, 2), fwd=1, bwd=2)
    got = {(op.stage, op.kind, op.mb): (op.start, op.end) for op in tl}
    assert got[(1, "F", 0)] == (1, 2) and got[(1, "B", 1)] == (5, 7) and got[(0, "B", 1)] == (7, 9)


def test_comm_cost_delays_each_hop():
    tl = sim.simulate(sim.orders("gpipe", 3, 1), fwd=1, bwd=1, comm=0.5)
    assert sim.step_time(tl) == 6 + 4 * 0.5      # 4 messages on the critical path


def test_deadlock_and_invalid_orders_are_reported():
    # stage 0 waits for B0's gradient, stage 1 for F1's activation: a cycle
    stuck = [[("F", 0), ("B", 0), ("F", 1), ("B", 1)], [("F", 0), ("F", 1), ("B", 0), ("B", 1)]]
    with pytest.raises(sim.Deadlock, match=r"\{0: \('B', 0\), 1: \('F', 1\)\}"):
        sim.simulate(stuck)
    with pytest.raises(ValueError, match="each microbatch once"):
        sim.validate([[("F", 1), ("F", 0), ("B", 0), ("B", 1)]], 2)
    with pytest.raises(ValueError, match="B0 comes before F0"):
        sim.validate([[("B", 0), ("F", 0)]], 1)
    with pytest.raises(ValueError, match="naive"):
        sim.stage_order("naive", 2, 4, 0)
    with pytest.raises(ValueError, match="unknown schedule"):
        sim.stage_order("zigzag", 2, 4, 0)


@pytest.mark.parametrize("m", [1, 2, 4, 8])
def test_messages_and_gaps_add_idle_time(m):
    """GPipe, p = 2: the step grows by two messages and 2m - 1 gaps of the critical stage."""
    fwd, bwd, comm, gap = 1.0, 2.0, 0.1, 0.05
    tl = sim.simulate(sim.orders("gpipe", 2, m), fwd, bwd, comm, gap)
    assert sim.step_time(tl) == pytest.approx((m + 1) * (fwd + bwd) + 2 * comm + (2 * m - 1) * gap)
    assert sim.bubble_fraction(tl) > bubble_theory(2, m)
    sim.validate(sim.orders("1f1b", 2, m), m)
    assert sim.bubble_fraction(sim.simulate(sim.orders("1f1b", 2, m), fwd, bwd, comm, gap)) > bubble_theory(2, m)
