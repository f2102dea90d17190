"""Expert parallelism on 2 processes (gloo): the all-to-all carries unequal splits forward and
backward (bytes counted from its buffers by wire.recording), and the parity check fails when
the router's gradient is not summed over the ranks. The entry points refuse bad flags in one
line. The full parity (world sizes 2 and 4, every case, the mesh) runs once, in notebook 14."""
import pytest

from source_code.errors import LaunchError
from source_code.expert_parallel import bench, compare, harness, train
from source_code.processes import spawn


@pytest.fixture(scope="module")
def per_rank():
    return spawn(harness.can_fail, 2, device="cpu")


@pytest.mark.parity
def test_unequal_splits_travel_and_the_layer_matches(per_rank):
    for r in per_rank:
        good = r["good"]
        assert [c["what"] for c in good["calls"]] == ["counts", "payload", "payload", "payload", "payload"]
        payload = [c for c in good["calls"] if c["what"] == "payload"]
        assert any(c["send"][0] != c["send"][1] for c in payload), payload    # the splits were unequal
        dispatch, back, back_grad, dispatch_grad = payload
        assert back["send"] == dispatch["recv"] and dispatch_grad["send"] == dispatch["recv"]
        assert good["calls"][0]["row_bytes"] == 8                            # one int64 count per expert
        assert dispatch["row_bytes"] == good["row_bytes"]                     # one token row of fp32
        assert good["dropped"] > 0
        assert max(good["diffs"].values()) <= r["tol"], good["diffs"]
    # what one rank sends, the other receives
    a, b = ([c for c in r["good"]["calls"] if c["what"] == "payload"][0] for r in per_rank)
    assert a["sent"] == b["received"] and b["sent"] == a["received"]
    assert a["sent"] == a["send"][1] * a["row_bytes"]                       # rank 0's piece for rank 1


@pytest.mark.parity
def test_all_to_all_refuses_splits_that_do_not_match_its_buffer(per_rank):
    assert all("add up to 2 rows, but x has 3" in r["refused"] for r in per_rank), per_rank[0]["refused"]


@pytest.mark.parity
def test_parity_fails_without_summing_the_router_gradient(per_rank):
    for r in per_rank:
        assert r["bad"]["diffs"]["router grad"] > 100 * r["tol"], r["bad"]["diffs"]
        assert r["bad"]["diffs"]["expert grads"] <= r["tol"]       # the experts saw every token


W4 = {"RANK": "0", "WORLD_SIZE": "4"}


@pytest.mark.parametrize("argv, env, match", [
    (["--ep", "3"], W4, r"not divisible by --ep 3; use one of \[1, 2, 4\]"),
    (["--ep", "8"], W4, "not divisible by --ep 8"),
    (["--experts", "6"], W4, "do not split"),
    (["--k", "9"], {}, "exceeds"),
    (["--batch-size", "30"], W4, "does not divide"),
    (["--aux-coef", "-1"], {}, ">= 0"),
    (["--aux-coef", "nan"], {}, ">= 0"),
    (["--dim", "30"], {}, "not divisible by --heads 4"),
    (["--seed", "-3"], {}, "--seed must be >= 0")])
def test_train_refuses_bad_flags_before_starting(argv, env, match):
    with pytest.raises(LaunchError, match=match):
        train.check(train.parse_args(argv), env)


@pytest.mark.parametrize("argv, match", [
    (["--steps", "0"], "positive integer"), (["--k", "-1"], "positive integer"),
    (["--experts", "0"], "positive integer"), (["--capacity-factor", "0"], "positive number"),
    (["--gates", "sum"], "invalid choice"), (["--heads", "0"], "positive integer")])
def test_train_flag_types_refuse_zero_and_negative_sizes(argv, match):
    with pytest.raises(LaunchError, match=match):
        train.parse_args(argv)


@pytest.mark.parametrize("argv, match", [
    (["--world", "1"], "at least 2"), (["--experts", "6"], "do not split over --world 4"),
    (["--k", "9"], "exceeds --experts 8"), (["--tokens", "3"], "divisible by --experts"),
    (["--reps", "0"], "positive integer"), (["--dim", "-4"], "positive integer")])
def test_bench_refuses_bad_flags_before_starting(argv, match):
    with pytest.raises(LaunchError, match=match):
        bench.main(argv)


@pytest.mark.parametrize("argv, match", [
    (["--steps", "0"], "positive integer"), (["--aux-coef", "0"], "positive number"),
    (["--device", "gpu"], "invalid choice")])
def test_compare_refuses_bad_flags_before_starting(argv, match):
    with pytest.raises(LaunchError, match=match):
        compare.main(argv)
