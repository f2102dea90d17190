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
                          r"own_fsdp_state_ratio=(\S+) own_fsdp_backward_peak_ratio=(\S+)", ln.strip())
             for ln in out.splitlines() if ln.startswith("summary:")]
    assert len(found) == 1 and found[0], f"no single summary line with the FSDP figures: {out[-2000:]!r}"
    m = found[0]
    res = json.loads((tmp_path / "r.json").read_text())
    # 2 ranks: each gradient element is g0 + g1 in every implementation, so the weights are equal
    par = res["parity"]
    assert par["own_fsdp"] == {"max_abs_diff": 0.0, "bitwise": True}, par
    assert par["own_fsdp_fp64"] == {"max_abs_diff": 0.0, "bitwise": True}, par
    assert float(m.group(1)) == float(m.group(2)) == 0.0
    b = res["bytes"]
    assert b["own_fsdp"]["resident"] < b["zero2"]["resident"] < b["zero1"]["resident"] < b["ddp"]["resident"]
    assert float(m.group(3)) == pytest.approx(b["own_fsdp"]["resident"] / b["ddp"]["resident"], abs=1e-4)
    assert float(m.group(4)) == pytest.approx(b["own_fsdp"]["backward_peak"] / b["ddp"]["backward_peak"], abs=1e-4)
    # the backward peak: one block's full parameters and full gradient, the previous unit's
    # gradient in its reduce-scatter (one in flight), on top of the sharded state
    parts, block = b["own_fsdp"]["backward_parts"], b["own_fsdp"]["gathered"]
    assert parts["full_params"] == parts["full_grads"] == block, parts
    assert block < parts["in_flight"] < 2 * block, parts
    # overlap: unit i+1's gather issued before unit i computes; backward issues in reverse order;
    # each reduce-scatter in flight while the next unit's backward computes, the last waited
    # for after the whole backward
    tl = res["timeline"]["overlapped"]
    iv = tl["intervals"]
    names = list(iv)
    fw = {u: iv[u]["forward"] for u in names}
    assert all(fw[u]["gather"][0] <= fw[t]["compute"][0] for t, u in zip(names, names[1:])), iv
    assert tl["backward_issue_order"][:3] == ["head", "layers.1", "layers.0"], tl["backward_issue_order"]
    bw = {u: iv[u]["backward"] for u in names}
    order = tl["backward_order"]
    for t, u in zip(order, order[1:]):
        assert bw[t]["reduce"][0] <= bw[u]["compute"][0] <= bw[t]["wait"], (t, u, bw)
    assert bw[order[-1]]["wait"] >= max(bw[u]["compute"][1] for u in names), bw
    serial = res["timeline"]["serial"]                  # each waited for before the next computes
    sw = {u: serial["intervals"][u]["backward"] for u in names}
    assert all(sw[t]["wait"] <= sw[u]["compute"][0] for t, u in zip(serial["backward_order"],
                                                                    serial["backward_order"][1:])), sw
    # bf16 mixed precision (own_fsdp_mixed.py, fully_shard with MixedPrecisionPolicy): the
    # all-gathers carry half the bytes, the reduce-scatters fp32 either way, the two train alike
    c = res["comm"]
    for impl in ("own_fsdp", "fully_shard"):
        assert 2 * c[impl + "_bf16"]["all_gather"] == c[impl]["all_gather"], c
        assert c[impl + "_bf16"]["reduce_scatter"] == c[impl]["reduce_scatter"], c
        assert 2 * b[impl + "_bf16"]["gathered"] == b[impl]["gathered"], b
        assert b[impl + "_bf16"]["resident"] == b[impl]["resident"], b
    mp, vs32 = (par[k]["max_abs_diff"] for k in ("own_fsdp_bf16_vs_fully_shard_bf16", "own_fsdp_bf16_vs_own_fsdp"))
    assert mp <= 1e-6 < vs32, par
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
    assert res["parity"]["own_fsdp_bf16_vs_fully_shard_bf16"]["max_abs_diff"] <= 1e-6, res["parity"]
    assert res["units"] == ["tok", "pos", "layers.0", "layers.1", "head"]
    assert all(".norm" in n or n.startswith("norm") for n in res["replicated"]), res["replicated"]


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
