"""Expert parallelism on one process: routing, capacity, the balancing loss, the MoE layer,
parameter counts, the send-counts exercise (the multi-process parity runs in notebook 14)."""
import pytest
import torch

from source_code.expert_parallel import moe, router
from source_code.expert_parallel.ep_layer import owned_experts
from source_code.expert_parallel.exercises import check_send_counts
from source_code.models import MLP, Block
from source_code.solutions.nb14_expert_parallel import reference_send_counts


def test_capacity_and_priority_first_choices_before_second():
    assert router.capacity(12, 4, 2, 1.0) == 6 and router.capacity(10, 4, 1, 1.25) == 4
    assert router.capacity(10, 4, 1, None) == 10
    # 4 tokens all choose expert 0 first and expert 1 second; capacity 2 per expert
    expert = torch.tensor([[0, 1]] * 4)
    keep = router.within_capacity(expert, 2, 2)
    assert keep[:, 0].tolist() == [True, True, False, False]      # first choices in token order
    assert keep[:, 1].tolist() == [True, True, False, False]


def test_drops_are_what_exceeds_capacity_per_group():
    torch.manual_seed(0)
    logits = torch.randn(64, 8)
    logits[:, 3] += 1.5
    r = router.route(logits, 2, 1.0, groups=4)
    dropped = int((~r.keep).sum())
    assert dropped > 0
    assert dropped == pytest.approx(router.dropped_fraction(r.counts, 16, 2, 1.0) * r.expert.numel())
    assert r.counts.shape == (4, 8) and int(r.counts.sum()) == 128
    for g, keep in enumerate(r.keep.split(16)):                    # each group within capacity
        kept = router.tokens_per_expert(r.expert[16 * g:16 * (g + 1)], 8, keep)
        assert int(kept.max()) <= router.capacity(16, 8, 2, 1.0)


def test_balance_loss_is_one_when_uniform_and_grows_with_skew():
    n, e = 32, 4
    uniform = torch.full((n, e), 1 / e)
    expert = torch.arange(n).remainder(e)[:, None]
    assert router.balance_loss(uniform, expert).item() == pytest.approx(1.0)
    skewed = torch.tensor([[0.7, 0.1, 0.1, 0.1]]).repeat(n, 1)
    assert router.balance_loss(skewed, torch.zeros(n, 1, dtype=torch.long)).item() == pytest.approx(2.8)


def test_route_refuses_bad_k_and_groups():
    with pytest.raises(ValueError, match="k must be"):
        router.route(torch.randn(8, 4), 5)
    with pytest.raises(ValueError, match="equal groups"):
        router.route(torch.randn(9, 4), 1, groups=2)


def test_moe_equals_a_token_by_token_loop_and_dropped_tokens_pass_the_residual():
    torch.manual_seed(0)
    layer = moe.MoE(8, 16, 4, k=2, capacity_factor=0.5)
    x = torch.randn(2, 6, 8)
    y = layer(x).reshape(-1, 8)
    rows = x.reshape(-1, 8)
    r = router.route(layer.router(rows), 2, 0.5)
    for t in range(rows.shape[0]):
        want = sum((r.gate[t, j] * layer.experts[int(r.expert[t, j])](rows[t]) for j in range(2)
                    if r.keep[t, j]), torch.zeros(8))
        assert torch.allclose(y[t], want, atol=1e-6)
    gone = (~r.keep).all(1)
    assert gone.any() and (y[gone] == 0).all()                     # fully dropped: the MoE adds 0
    block = Block(8, 2)
    block.mlp = layer
    h = torch.randn(1, 12, 8)
    a = h + block.attn(block.norm1(h))
    out = block(h)
    routed = router.route(layer.router(block.norm2(a).reshape(-1, 8)), 2, 0.5)
    dropped = (~routed.keep).all(1)
    assert torch.equal(out[0][dropped], a[0][dropped])             # the residual carries them


def test_parameters_grow_with_experts_but_not_the_work_per_token():
    layer = moe.MoE(32, 128, 8, k=1)
    dense = sum(p.numel() for p in MLP(32, 128).parameters())
    counts = moe.active_parameters(layer)
    assert counts["per_expert"] == dense
    assert counts["total"] == 8 * dense + 32 * 8
    assert counts["per_token"] == dense + 32 * 8                   # one expert + the router
    model = moe.moe_transformer({"vocab_size": 32, "dim": 32, "n_layers": 2, "n_heads": 4, "max_len": 64}, 8)
    assert len(moe.moe_layers(model)) == 2
    model(torch.randint(0, 17, (2, 8)))
    assert moe.aux_loss(model).requires_grad


def test_owned_experts_are_contiguous_blocks():
    assert [list(owned_experts(8, 4, r)) for r in range(4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    with pytest.raises(ValueError, match="evenly"):
        owned_experts(6, 4, 0)


def _per_expert(expert, keep, n_experts, world):
    return router.tokens_per_expert(expert, n_experts, keep).tolist()


def _with_dropped(expert, keep, n_experts, world):
    return reference_send_counts(expert, torch.ones_like(keep), n_experts, world)


def _first_choice(expert, keep, n_experts, world):
    return reference_send_counts(expert[:, :1], keep[:, :1], n_experts, world)


def _round_robin(expert, keep, n_experts, world):
    return torch.bincount(expert[keep] % world, minlength=world).tolist()


def _tokens(expert, keep, n_experts, world):
    ranks = torch.where(keep, expert // (n_experts // world), -1)
    return [int((ranks == r).any(1).sum()) for r in range(world)]


def _todo(expert, keep, n_experts, world):
    return None


def test_exercise_accepts_the_solution():
    assert check_send_counts(reference_send_counts).startswith("correct")


@pytest.mark.parametrize("wrong, hint", [
    (_per_expert, "one per expert"), (_with_dropped, "dropped"), (_first_choice, "first choice"),
    (_round_robin, "round robin"), (_tokens, "tokens, not assignments")])
def test_exercise_names_the_typical_mistakes(wrong, hint):
    with pytest.raises(AssertionError, match=hint):
        check_send_counts(wrong)


def test_exercise_not_done_yet():
    with pytest.raises(NotImplementedError):
        check_send_counts(_todo)
