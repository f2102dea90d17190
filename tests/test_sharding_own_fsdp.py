"""FSDP by hand (sharding/own_fsdp.py): the entry point's summary and bitwise parity on 2 ranks,
padding on 3 ranks, flags refused in one line. Notebook 09 runs the 4-rank report and asserts
its parity, bytes and ratio; these are the configurations it does not print."""
import json
import re

import pytest

from source_code.errors import LaunchError
from source_code.sharding import own_fsdp_report

pytestmark = pytest.mark.parity


def test_two_ranks_bitwise_and_summary_line(torchrun, tmp_path):
    out = torchrun("source_code.sharding.own_fsdp_report", "--steps", "2", "--out",
                   tmp_path / "r.json", nproc=2, stream=False).stdout
    assert "terminate called" not in out and "Traceback" not in out, out[-2000:]
    # rank 0's summary line; torchrun or another rank may still write after it
    found = [re.fullmatch(r"summary: .* own_fsdp_fp32_max_abs_diff=(\S+) own_fsdp_max_abs_diff=(\S+) "
                          r"own_fsdp_state_ratio=(\S+) own_fsdp_backward_peak_ratio=(\S+) "
                          r"prefetch_backward_peak_ratio=(\S+)", ln.strip())
             for ln in out.splitlines() if ln.startswith("summary:")]
    assert len(found) == 1 and found[0], f"no single summary line with the FSDP figures: {out[-2000:]!r}"
    m = found[0]
    res = json.loads((tmp_path / "r.json").read_text())
    # 2 ranks: each gradient element is g0 + g1 in every implementation, so the weights are equal
    par = res["parity"]
    assert par["own_fsdp"]["bitwise"] and par["own_fsdp"]["max_abs_diff"] == 0.0, par
    assert par["own_fsdp_fp64"]["bitwise"] and par["own_fsdp_fp64"]["max_abs_diff"] == 0.0, par
    assert float(m.group(1)) == float(m.group(2)) == 0.0
    assert float(m.group(5)) == pytest.approx(res["prefetch_backward_peak_ratio"], abs=1e-4)
    b = res["bytes"]
    assert b["own_fsdp"]["resident"] < b["zero2"]["resident"] < b["zero1"]["resident"] < b["ddp"]["resident"]
    assert float(m.group(3)) == pytest.approx(b["own_fsdp"]["resident"] / b["ddp"]["resident"], abs=1e-4)
    assert float(m.group(4)) == pytest.approx(b["own_fsdp"]["backward_peak"] / b["ddp"]["backward_peak"], abs=1e-4)
    # the backward peak: one block's full parameters (not two: freed before the next gathers),
    # the previous unit's gradient in its reduce-scatter (one in flight, not none, not two);
    # with prefetch a second unit is full meanwhile, and the peak is higher
    parts, block = b["own_fsdp"]["backward_parts"], b["own_fsdp"]["gathered"]
    assert parts["full_params"] == block, parts
    assert block < parts["in_flight"] < 2 * block, parts
    # with prefetch, while layers.1's gradient completes layers.0's buffer is filling too: two
    # blocks full where the plain units hold one; the peak can only grow
    prefetch = res["timeline"]["overlapped"]
    assert prefetch["at_units"]["layers.1"]["full_params"] == 2 * block, prefetch["at_units"]
    assert b["own_fsdp"]["at_units"]["layers.1"]["full_params"] == block, b["own_fsdp"]["at_units"]
    assert prefetch["backward_peak"] >= b["own_fsdp"]["backward_peak"], (prefetch, b["own_fsdp"])
    # overlap: each reduce-scatter issued before the next unit's backward computes and waited for
    # only after it started (the serial variant: waited for before); measured stamps, so an
    # implementation that waited at once would fail here
    tl = res["timeline"]["overlapped"]
    names = list(tl["intervals"])
    bw = {u: tl["intervals"][u]["backward"] for u in names}
    order = tl["backward_order"]
    for t, u in zip(order, order[1:]):
        assert bw[t]["reduce"][0] <= bw[u]["compute"][0] <= bw[t]["wait"], (t, u, bw)
    # every replicated parameter's blocking all-reduce stamped once, in the backward, and its
    # time taken out of the computation the transfers may hide under
    assert len(tl["all_reduces"]) == len(res["replicated"]), (tl["all_reduces"], res["replicated"])
    assert all(0 < a <= b for a, b in tl["all_reduces"]), tl["all_reduces"]
    serial = res["timeline"]["serial"]                  # each waited for before the next computes
    sw = {u: serial["intervals"][u]["backward"] for u in names}
    assert all(sw[t]["wait"] <= sw[u]["compute"][0] for t, u in zip(serial["backward_order"],
                                                                    serial["backward_order"][1:])), sw
    # bf16 mixed precision: FSDP2's policy measured (half the bytes gathered, fp32 reduced and
    # kept); by hand the same casts train as fully_shard does, a few fp32 roundings apart at most
    c = res["comm"]
    assert 2 * c["fully_shard_bf16"]["all_gather"] == c["fully_shard"]["all_gather"], c
    assert c["fully_shard_bf16"]["reduce_scatter"] == c["fully_shard"]["reduce_scatter"], c
    assert 2 * b["fully_shard_bf16"]["gathered"] == b["fully_shard"]["gathered"], b
    assert b["fully_shard_bf16"]["resident"] == b["fully_shard"]["resident"], b
    mp = par["own_fsdp_bf16_vs_fully_shard_bf16"]["max_abs_diff"]
    assert par["own_fsdp_bf16_vs_fully_shard_bf16"]["max_ulps"] <= 4, par
    assert f"bf16_vs_fully_shard_bf16={mp:.3g} " in m.string, m.string


def test_sizes_that_do_not_divide_three_ranks():
    from source_code.processes import spawn
    # dim 20: every unit's size is odd or not a multiple of 3, so every shard is padded
    res = spawn(own_fsdp_report.run_here, 3, {"dim": 20, "batch_size": 12, "steps": 2},
                timeout=240, stream=False)
    res = res[0]
    # fp64: the same code, the reduction order's rounding 2^-52 instead of 2^-23
    assert res["parity"]["own_fsdp_fp64"]["max_abs_diff"] <= 1e-12, res["parity"]
    assert res["parity"]["fully_shard_fp64"]["max_abs_diff"] <= 1e-12, res["parity"]
    # bf16 with padded shards on 3 ranks: still fully_shard's weights with the same policy
    assert res["parity"]["own_fsdp_bf16_vs_fully_shard_bf16"]["max_ulps"] <= 4, res["parity"]
    assert res["units"] == ["tok", "pos", "layers.0", "layers.1", "head"]
    assert all(".norm" in n or n.startswith("norm") for n in res["replicated"]), res["replicated"]
    # fully_shard's backward peak, counted at each group's post-backward: block 0 and the root group
    # full there (the root gathered again for the backward; the storages hold the padded rows, the
    # forward's count the parameters' elements), the root last
    fsdp2 = res["bytes"]["fully_shard"]
    assert fsdp2["at_units"]["layers.0"]["full_params"] >= fsdp2["gathered"], fsdp2["at_units"]
    assert list(fsdp2["at_units"]) == ["layers.1", "layers.0", "root"], list(fsdp2["at_units"])


@pytest.mark.parametrize("argv,says", [
    (["--dim", "30"], "multiple of 4"),
    (["--steps", "0"], "--steps"),
    (["--batch-size", "10"], "does not divide among 4"),
    (["--out", "/proc/nope/r.json"], "cannot write"),
])
def test_bad_flags_one_line(monkeypatch, argv, says):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(LaunchError) as err:
        own_fsdp_report.parse_args(argv)
    assert says in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_gpu_model_books_each_wait_to_the_transfer_on_the_link():
    """own_fsdp_predict: a gather queued behind a reduce-scatter is the reduce-scatter's wait; no
    transfer is booked more than its own time, and every idle instant is booked to one."""
    from source_code.sharding import own_fsdp_predict
    for cfg, batch, seq in ((own_fsdp_report.WIDE, 4, 4096), (own_fsdp_report.WIDE, 1, 256)):
        units = own_fsdp_predict.unit_costs(cfg, batch, seq)
        compute = sum(u["fwd_flops"] + u["bwd_flops"] for u in units) / own_fsdp_predict.GPU_NODE["flops"]
        for overlap in (False, True):
            walk = own_fsdp_predict.simulate(units, 4, overlap)
            waited = walk["exposed_s"]
            for phase, own_time in (("forward", walk["gather_s"]), ("backward", walk["gather_s"]),
                                    ("reduce", walk["reduce_s"])):
                for unit, s in waited[phase].items():
                    assert s <= own_time[unit] * (1 + 1e-9), (overlap, phase, unit, s, own_time[unit])
            idle = sum(sum(v.values()) for v in waited.values())
            assert walk["step_s"] == pytest.approx(compute + idle, rel=1e-9), (overlap, walk["step_s"])


def test_gpu_model_on_one_process_has_no_transfer_and_no_waits():
    """One GPU (make gpu-smoke's own_fsdp_bf16 check): nothing to gather, nothing hidden, and the
    step is its computation, not a division by zero."""
    from source_code.sharding import own_fsdp_predict
    got = own_fsdp_predict.predict(own_fsdp_report.WIDE, 1, 256, 1)
    units = own_fsdp_predict.unit_costs(own_fsdp_report.WIDE, 1, 256)
    compute = sum(u["fwd_flops"] + u["bwd_flops"] for u in units) / own_fsdp_predict.GPU_NODE["flops"]
    for walk in (got["serial"], got["overlap"]):
        assert walk["comm_s"] == 0 and walk["hidden_fraction"] == 0
        assert walk["step_s"] == pytest.approx(compute, rel=1e-9)
    assert got["exposed_forward"] == []


def test_hidden_share_leaves_the_blocking_all_reduces_out():
    """own_fsdp_timeline.hidden_fraction: overlapping computations count once; an all-reduce
    inside a unit's compute window is not computation."""
    from source_code.sharding.own_fsdp_timeline import hidden_fraction
    iv = {"a": {"backward": {"compute": (0.0, 10.0), "reduce": (5.0, 15.0)}},
          "b": {"backward": {"compute": (8.0, 12.0)}}}
    assert hidden_fraction(iv, "backward") == pytest.approx(0.7)          # 5..12 of 5..15
    assert hidden_fraction(iv, "backward", blocked=[(6.0, 9.0)]) == pytest.approx(0.4)
    assert hidden_fraction(iv, "backward", blocked=[(0.0, 20.0)]) == 0.0
