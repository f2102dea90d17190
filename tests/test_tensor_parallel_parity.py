"""Tensor parallelism by hand: the TP (and TP + SP) TransformerLM equals the dense one on 2 and 4
ranks, issues exactly the collectives of the design, and SP keeps fewer activation bytes."""
import pytest
import torch
import torch.nn as nn

from source_code.processes import spawn
from source_code.tensor_parallel.harness import Workload, report
from source_code.tensor_parallel.layers import shard_range
from source_code.tensor_parallel.model import dense_slice

TOL = 1e-5
WORK = Workload()  # 2 blocks, dim 32, 4 heads, batch 4 x 16 tokens


def test_shard_range_and_dense_slice():
    assert [shard_range(8, r, 4) for r in range(4)] == [(0, 2), (2, 4), (4, 6), (6, 8)]
    with pytest.raises(ValueError, match="do not split evenly"):
        shard_range(10, 0, 4)
    w = nn.Parameter(torch.zeros(2, 4))
    w.owner = ("columns", 2, 4)
    assert dense_slice(torch.arange(32.).view(4, 8), w).tolist()[0] == [2.0, 3.0]


@pytest.fixture(scope="module", params=[2, 4], ids=["2-ranks", "4-ranks"])
def per_rank(request):
    return spawn(report, request.param, WORK, device="cpu")


@pytest.mark.parity
@pytest.mark.parametrize("mode", ["tp", "sp", "vp", "sp_vp"])
def test_outputs_and_gradients_equal_dense(per_rank, mode):
    for r in per_rank:
        res = r[mode]
        print(f"{mode} rank {res['rank']}/{res['world']}: logits {res['logits_diff']:.1e} "
              f"loss {res['loss_diff']:.1e} grads {res['grad_diff']:.1e}")
        assert res["logits_diff"] <= TOL and res["loss_diff"] <= TOL and res["grad_diff"] <= TOL, res["grad_diffs"]


@pytest.mark.parity
def test_tp_collectives_match_the_design(per_rank):
    """2 all-reduces forward + 2 backward per block (attention and MLP), each of one (b, t, d)
    activation, and nothing else: embeddings, LayerNorms and head stay replicated."""
    L, act = WORK.layers, WORK.batch * WORK.seq * WORK.dim * 4
    for r in per_rank:
        assert r["tp"]["table"] == {("all_reduce", "forward"): (2 * L, 2 * L * act),
                                    ("all_reduce", "backward"): (2 * L, 2 * L * act)}
        tags = [c["tag"] for c in r["tp"]["calls"] if c["phase"] == "forward"]
        assert tags == [f"block{i}.{k}" for i in range(L) for k in ("attn", "mlp")]


@pytest.mark.parity
def test_sp_collectives_match_the_design(per_rank):
    """SP: each all-reduce becomes an all-gather (into the TP region) + a reduce-scatter (out of
    it), plus one all-gather before the head; backward mirrors it and all-gathers each column
    layer's saved input shard once more (q/k/v share one: 2 per block); the t/n-token
    parameters (2 LayerNorms + the MLP's row bias per block, the final LayerNorm) get their
    grads summed."""
    L, act = WORK.layers, WORK.batch * WORK.seq * WORK.dim * 4
    for r in per_rank:
        t, n = r["sp"]["table"], r["sp"]["world"]
        assert t[("all_gather", "forward")] == (2 * L + 1, (2 * L + 1) * act)
        assert t[("all_gather", "backward")] == (4 * L + 1, (4 * L + 1) * act)
        for phase in ("forward", "backward"):
            assert t[("reduce_scatter", phase)] == (2 * L, 2 * L * act)
        again = [c["tag"] for c in r["sp"]["calls"] if c["tag"].endswith(".again")]
        assert again == [f"block{i}.{k}.again" for i in reversed(range(L)) for k in ("mlp-in", "qkv")]
        assert all(c["op"] == "all_gather" and c["phase"] == "backward" for c in r["sp"]["calls"]
                   if c["tag"].endswith(".again"))
        wire = lambda mode: sum(c["wire"] for c in r[mode]["calls"] if c["tag"].startswith("block"))
        # all-reduce = reduce-scatter + all-gather: the same bytes sent, plus the 2 re-gathers a block
        assert wire("sp") == wire("tp") + 2 * L * act * (n - 1) / n
        assert r["sp_vp"]["table"][("all_gather", "backward")][0] == 4 * L + 2   # + the head's input
        n_params = 5 * L + 2
        assert t[("all_reduce", "backward")][0] == n_params
        assert ("all_reduce", "forward") not in t


@pytest.mark.parity
def test_vocab_parallel_collectives(per_rank):
    """Vocabulary-parallel embedding and loss: + 1 all-reduce forward (the embedding's sum) + 3
    small ones (max, sum of exp, target logit, of b x t numbers) + 1 backward (the head's input)."""
    L, act = WORK.layers, WORK.batch * WORK.seq * WORK.dim * 4
    for r in per_rank:
        t = r["vp"]["table"]
        assert t[("all_reduce", "forward")] == (2 * L + 4, (2 * L + 1) * act + 3 * WORK.batch * WORK.seq * 4)
        assert t[("all_reduce", "backward")] == (2 * L + 1, (2 * L + 1) * act)


@pytest.mark.parity
def test_sp_stores_1_over_n_of_the_layernorm_regions_and_linear_inputs(per_rank):
    """The LayerNorm regions and the column layers' saved inputs shrink by n with SP (the shard
    is kept, not the gathered input); the rest is the same as plain TP."""
    L, act = WORK.layers, WORK.batch * WORK.seq * WORK.dim * 4
    for r in per_rank:
        a, n = r["activations"], r["activations"]["world"]
        assert a["sp"]["layernorm"] * n == a["tp"]["layernorm"] == a["dense"]["layernorm"]
        assert a["sp"]["linear_input"] * n == a["tp"]["linear_input"] == a["dense"]["linear_input"] == 2 * L * act
        assert a["sp"]["other"] == a["tp"]["other"] < a["dense"]["other"]
        assert a["sp"]["total"] < a["tp"]["total"] < a["dense"]["total"]
