"""Expert parallelism on one process: routing, capacity, the balancing loss, the MoE layer,
parameter counts, the send-counts exercise (the multi-process parity runs in notebook 14)."""
import pytest
import torch

from source_code.expert_parallel import moe, router
from source_code.expert_parallel.ep_layer import owned_experts
from source_code.expert_parallel.exercises import ExerciseFailed, check_send_counts
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


def test_gates_renormalised_for_top_k_and_the_probability_for_top_1():
    torch.manual_seed(0)
    logits = torch.randn(16, 6)
    probs = torch.softmax(logits, -1)
    top2 = router.route(logits, 2)
    assert torch.allclose(top2.gate.sum(-1), torch.ones(16))                 # GShard: g / (g1 + g2)
    raw = router.route(logits, 2, renormalise=False)
    assert torch.allclose(raw.gate, probs.topk(2, -1).values)
    top1 = router.route(logits, 1)
    assert torch.allclose(top1.gate[:, 0], probs.max(-1).values)             # Switch: the probability
    layer = moe.MoE(8, 16, 6, k=2)
    x = torch.randn(16, 1, 8)
    y = layer(x).reshape(-1, 8)
    mass = torch.softmax(layer.router(x.reshape(-1, 8)), -1).topk(2, -1).values.sum(-1)
    moe.set_routing(layer, renormalise=False)
    assert torch.allclose(layer(x).reshape(-1, 8), mass[:, None] * y, atol=1e-6)


def test_top1_renormalised_gives_the_router_no_gradient_from_the_output():
    torch.manual_seed(0)
    x, g = torch.randn(32, 1, 8), torch.randn(32, 1, 8)
    norms = {}
    for renormalise in (False, True):
        layer = moe.MoE(8, 16, 4, k=1, renormalise=renormalise)
        torch.manual_seed(1)
        layer.router.reset_parameters()
        (layer(x) * g).sum().backward()
        norms[renormalise] = layer.router.weight.grad.norm().item()
    assert norms[False] > 1e-3 and norms[True] < 1e-6 * norms[False], norms


def test_balance_loss_is_one_for_even_counts_whatever_the_probabilities():
    leaning = torch.tensor([0.0, 0.5, 1.0, 1.5])
    logits = (leaning + 3.0 * torch.eye(4)[torch.arange(12) % 4]).requires_grad_(True)
    r = router.route(logits, 1)
    assert r.counts[0].tolist() == [3, 3, 3, 3]
    assert r.probs.mean(0).max() - r.probs.mean(0).min() > 0.05              # probabilities far from even
    assert r.aux.item() == pytest.approx(1.0, abs=1e-6)
    (grad,) = torch.autograd.grad(r.aux, logits)
    assert grad.abs().max() < 1e-6                                           # nothing to correct
    skew = torch.randn(12, 4, generator=torch.Generator().manual_seed(0))
    skew[:, 0] += 1.5
    skew.requires_grad_(True)
    s = router.route(skew, 1)
    (grad,) = torch.autograd.grad(s.aux, skew)
    busiest = int(s.counts[0].argmax())
    assert s.aux.item() > 1.1 and grad[:, busiest].sum() > 0                # descent lowers the busiest


def test_lesson_functions_refuse_what_they_cannot_handle():
    with pytest.raises(ValueError, match="capacity_factor must be > 0"):
        router.capacity(8, 4, 1, 0.0)
    with pytest.raises(ValueError, match="n_tokens >= 1"):
        router.capacity(0, 4, 1, 1.0)
    with pytest.raises(ValueError, match="logits must be"):
        router.route(torch.randn(0, 4), 1)
    with pytest.raises(ValueError, match="1 <= k <= n_experts"):
        moe.MoE(8, 16, 4, k=5)
    with pytest.raises(ValueError, match="capacity_factor must be > 0"):
        moe.MoE(8, 16, 4, k=1, capacity_factor=-1.0)
    with pytest.raises(ValueError, match="k must be between"):
        moe.set_routing(moe.moe_transformer({"vocab_size": 32, "dim": 32, "n_layers": 1, "n_heads": 4,
                                             "max_len": 64}, 4), k=5)


# typical wrong answers of the exercise (and what they have in common with the right one)
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


def _eight_experts_only(expert, keep, n_experts, world):      # right on every printed-size routing
    return torch.bincount(expert[keep] // (8 // world), minlength=world)[:world].tolist()


def _raises(expert, keep, n_experts, world):
    return expert[keep].bincount()[world + 100]


def _todo(expert, keep, n_experts, world):
    raise NotImplementedError


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_exercise_accepts_the_solution(seed, capsys):
    assert check_send_counts(reference_send_counts, seed=seed)
    out = capsys.readouterr().out
    assert out.startswith("correct") and out.count("\n") == 1


def test_exercise_solution_cell_prints_nothing(capsys):
    assert check_send_counts(reference_send_counts, strict=True, quiet=True)
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("wrong, hint", [
    (_per_expert, "one per expert"), (_with_dropped, "dropped"), (_first_choice, "first choice"),
    (_round_robin, "like cards"), (_tokens, "you counted tokens"),
    (_eight_experts_only, "experts on"), (_raises, "raised IndexError")])
@pytest.mark.parametrize("seed", [0, 7])
def test_exercise_names_the_typical_mistakes_in_one_line(wrong, hint, seed, capsys):
    assert check_send_counts(wrong, seed=seed) is False
    out = capsys.readouterr().out
    assert out.startswith("not yet:") and out.count("\n") == 1 and hint in out, out
    with pytest.raises(ExerciseFailed, match=hint):
        check_send_counts(wrong, strict=True, seed=seed, quiet=True)


def test_exercise_hints_do_not_give_the_owner_formula_away(capsys):
    check_send_counts(_round_robin, seed=0)
    out = capsys.readouterr().out
    assert "//" not in out and "r*E/n" not in out and "E/n" not in out


def test_exercise_drawn_cases_catch_an_answer_that_fits_the_fixed_ones():
    """The fixed cases all have 8 experts: an answer hard-wired to 8 passes them, and only the
    drawn routings (other numbers of experts) catch it."""
    from source_code.expert_parallel.exercises import FIXED, cases
    fixed = cases(0)[:len(FIXED)]
    assert all(_eight_experts_only(e, k, n, w) == reference_send_counts(e, k, n, w) for _, e, k, n, w in fixed)
    assert not check_send_counts(_eight_experts_only, seed=0, quiet=True)


def test_exercise_not_done_yet(capsys):
    assert check_send_counts(_todo) is False
    assert capsys.readouterr().out.startswith("not done yet")
