"""The step-time model's comparison with a measured run (the run itself is in notebook 12)."""
from source_code.planner import timing


def _measured(step_s):
    return {"step_s": step_s, "tflops": 0.02, "gbps": 0.3, "world": 4, "micro_batches": 4, "seq": 32}


def test_planned_order_grows_with_the_traffic_of_the_zero_stage():
    want = timing.predict(_measured({1: 1, 2: 1, 3: 1}))
    assert want[1] < want[2] < want[3]


def test_order_check_fails_when_the_measurement_disagrees():
    ok = timing.compare(_measured({1: 0.18, 2: 0.30, 3: 0.60}))
    assert ok["order_holds"] and ok["measured_order"] == [1, 2, 3]
    bad = timing.compare(_measured({1: 0.18, 2: 0.70, 3: 0.60}))
    assert not bad["order_holds"] and bad["measured_order"] == [1, 3, 2]
    assert "DIFFERENT" in timing.format_lines(_measured({1: 0.18, 2: 0.70, 3: 0.60}), bad)[-1]


def test_measured_order_comes_from_each_rounds_own_ratios():
    # medians of separate steps say 2 < 3, but round by round ZeRO-3 took less than ZeRO-2
    m = {**_measured({1: 0.18, 2: 0.30, 3: 0.60}), "relative": {1: 1.0, 2: 2.5, 3: 2.0}}
    res = timing.compare(m)
    assert not res["order_holds"] and res["measured_order"] == [1, 3, 2]


def test_measured_order_is_read_from_the_cpu_seconds_not_the_wall_clock():
    # a neighbour's burst stretched ZeRO-1's wall time; the work each step cost did not change
    m = {**_measured({1: 0.90, 2: 0.40, 3: 0.80}), "cpu_s": {1: 0.40, 2: 0.60, 3: 1.20},
         "relative": {1: 1.0, 2: 1.5, 3: 3.0}}
    res = timing.compare(m)
    assert res["order_holds"] and res["wall_order"] == [2, 3, 1]
    assert "by wall s [2, 3, 1]" in timing.format_lines(m, res)[-1]
