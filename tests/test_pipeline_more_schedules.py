"""Interleaved 1F1B and ZB-H1 in the simulator: valid orders whose simulated bubbles equal their
formulas, and the cases outside the formulas' conditions."""
import pytest

from source_code.pipeline import simulator as sim
from source_code.pipeline.formulas import (bubble_theory, idle_fraction, interleaved_bubble,
                                           stored_microbatches, zb_h1_bubble)

COSTS = [(1, 2), (1, 1), (3, 5)]


@pytest.mark.parametrize("p", [2, 3, 4])
@pytest.mark.parametrize("v", [1, 2, 3])
def test_interleaved_bubble_is_p_minus_1_over_v_m(p, v):
    for m in (p, 2 * p, 4 * p):
        orders = sim.orders("interleaved", p, m, v)
        sim.validate(orders, m)
        for fwd, bwd in COSTS:   # a rank's whole F and B; a chunk's operation costs 1/v of them
            tl = sim.simulate(orders, fwd / v, bwd / v)
            assert sim.bubble_ratio(tl) == pytest.approx(interleaved_bubble(p, m, v))
            assert sim.step_time(tl) == pytest.approx(m * (fwd + bwd) + (p - 1) * (fwd + bwd) / v)
            assert sim.bubble_fraction(tl) == pytest.approx(idle_fraction(interleaved_bubble(p, m, v)))
        if v == 1:               # one chunk per rank: 1F1B's bubble (Megatron's order warms up longer)
            assert idle_fraction(interleaved_bubble(p, m, 1)) == pytest.approx(bubble_theory(p, m))


def test_interleaved_order_p2_m2_v2():
    assert sim.format_orders(sim.orders("interleaved", 2, 2, 2)) == (
        "stage 0: F0 F1 F0' F1' B0' B1' B0 B1\n"
        "stage 1: F0 F1 F0' F1' B0' B1' B0 B1")
    with pytest.raises(ValueError, match="multiple of p"):
        sim.orders("interleaved", 4, 6, 2)


@pytest.mark.parametrize("p", [2, 3, 4])
def test_zb_h1_bubble(p):
    for m in (p, p + 1, 8):
        orders = sim.orders("zb-h1", p, m)
        sim.validate(orders, m)
        assert [sim.peak_in_flight(o) for o in orders] == [stored_microbatches("zb-h1", p, m, s)
                                                           for s in range(p)]
        for fwd, bwd, wgt in [(1, 1, 1), (1, 2, 1), (2, 1, 1), (3, 2, 1), (1, 1, 2), (1, 3, 2)]:
            tl = sim.simulate(orders, fwd, bwd, wgt=wgt)
            assert sim.bubble_ratio(tl) == pytest.approx(zb_h1_bubble(p, m, fwd, bwd, wgt))
            one_f_one_b = sim.simulate(sim.orders("1f1b", p, m), fwd, bwd + wgt)
            if wgt <= fwd:       # the paper's (p - 1)(F + B - W) against 1F1B's (p - 1)(F + B + W)
                assert sim.step_time(tl) - m * (fwd + bwd + wgt) == pytest.approx((p - 1) * (fwd + bwd - wgt))
            assert sim.step_time(tl) < sim.step_time(one_f_one_b)


def test_zb_h1_a_third_of_1f1b_with_equal_costs():
    p, m = 4, 8
    zb = sim.bubble_ratio(sim.simulate(sim.orders("zb-h1", p, m), 1, 1, wgt=1))
    base = sim.bubble_ratio(sim.simulate(sim.orders("1f1b", p, m), 1, 2))
    assert zb == pytest.approx(base / 3)
    with pytest.raises(ValueError, match="m >= p"):
        sim.orders("zb-h1", 4, 2)


def test_split_backward_orders_are_checked():
    with pytest.raises(ValueError, match="W0 comes before B0"):
        sim.validate([[("F", 0), ("W", 0), ("B", 0)]], 1)
    with pytest.raises(ValueError, match="W operations"):
        sim.validate([[("F", 0), ("B", 0), ("W", 0), ("F", 1), ("B", 1)]], 2)
    with pytest.raises(ValueError, match="of chunk 1"):
        sim.validate([[("F", 0, 0), ("F", 1, 0), ("F", 0, 1), ("B", 0, 1), ("B", 0, 0), ("B", 1, 0)]], 2)
    # W waits for its own B only: a stage's W runs while the previous stage still computes
    tl = sim.simulate([[("F", 0), ("B", 0), ("W", 0)], [("F", 0), ("B", 0), ("W", 0)]], 1, 1, wgt=1)
    end = {(op.stage, op.kind): op.end for op in tl}
    assert end[(1, "W")] == 4 and end[(0, "B")] == 4 and end[(0, "W")] == 5
