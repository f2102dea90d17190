"""Expert parallelism on 2 processes (gloo): the all-to-all carries unequal splits forward and
backward, and the parity check fails when the router's gradient is not summed over the ranks.
The full parity (world sizes 2 and 4, every case, the mesh) runs once, in notebook 14."""
import pytest

from source_code.errors import LaunchError
from source_code.expert_parallel import harness, train
from source_code.processes import spawn


@pytest.fixture(scope="module")
def per_rank():
    return spawn(harness.can_fail, 2, device="cpu")


@pytest.mark.parity
def test_unequal_splits_travel_and_the_layer_matches(per_rank):
    for r in per_rank:
        good = r["good"]
        sends = [c["send"] for c in good["calls"]]
        assert any(s[0] != s[1] for s in sends), sends             # the splits were unequal
        assert [c["phase"] for c in good["calls"]] == ["forward", "forward", "backward", "backward"]
        assert good["dropped"] > 0
        assert max(good["diffs"].values()) <= r["tol"], good["diffs"]
    # what one rank sends, the other receives
    a, b = (r["good"]["calls"][0] for r in per_rank)
    assert a["sent"] == b["received"] and b["sent"] == a["received"]


@pytest.mark.parity
def test_parity_fails_without_summing_the_router_gradient(per_rank):
    for r in per_rank:
        assert r["bad"]["diffs"]["router grad"] > 100 * r["tol"], r["bad"]["diffs"]
        assert r["bad"]["diffs"]["expert grads"] <= r["tol"]       # the experts saw every token


@pytest.mark.parametrize("argv, env, match", [
    (["--ep", "3"], {"RANK": "0", "WORLD_SIZE": "4"}, "not divisible by --ep"),
    (["--experts", "6"], {"RANK": "0", "WORLD_SIZE": "4"}, "do not split"),
    (["--k", "9"], {}, "exceeds"),
    (["--batch-size", "30"], {"RANK": "0", "WORLD_SIZE": "4"}, "does not divide"),
    (["--aux-coef", "-1"], {}, ">= 0")])
def test_train_refuses_bad_flags_before_starting(argv, env, match):
    with pytest.raises(LaunchError, match=match):
        train.check(train.parse_args(argv), env)
