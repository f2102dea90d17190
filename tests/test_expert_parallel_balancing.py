"""Notebook 14's balancing in depth, single-process: the router z-loss, DeepSeek-V3's bias
(it changes the choice, never the gates), its update against the load. The training runs that
measure them against the auxiliary loss run once, in notebook 14."""
import math

import torch

from source_code.expert_parallel import moe, router


def test_z_loss_is_the_mean_squared_logsumexp():
    logits = torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0]])
    want = (math.log(2.0) ** 2 + math.log(4.0) ** 2) / 2
    assert math.isclose(router.z_loss(logits).item(), want, rel_tol=1e-6)
    assert math.isclose(router.route(logits, k=1).z.item(), want, rel_tol=1e-6)


def test_bias_changes_the_choice_but_not_the_gates():
    torch.manual_seed(0)
    logits = torch.randn(16, 4)
    plain = router.route(logits, k=2)
    bias = torch.tensor([-10.0, 0.0, 0.0, 0.0])                  # expert 0 never chosen
    biased = router.route(logits, k=2, bias=bias)
    assert not (biased.expert == 0).any() and (plain.expert == 0).any()
    chosen = plain.probs.gather(1, biased.expert)
    torch.testing.assert_close(biased.gate, chosen / chosen.sum(-1, keepdim=True))
    torch.testing.assert_close(biased.probs, plain.probs)


def test_bias_gives_no_gradient_to_the_choice_only_to_the_gates():
    logits = torch.randn(8, 4, requires_grad=True)
    r = router.route(logits, k=1, bias=torch.tensor([0.0, 1.0, 0.0, 0.0]))
    (g,) = torch.autograd.grad(r.gate.sum(), logits)
    assert (r.expert[:, 0] == 1).all() and g.abs().sum() > 0


def test_update_bias_lowers_the_overloaded_and_raises_the_underloaded():
    b = router.update_bias(None, torch.tensor([10, 2, 4, 4]), 0.1)
    torch.testing.assert_close(b, torch.tensor([-0.1, 0.1, 0.1, 0.1]))
    b = router.update_bias(b, torch.tensor([5, 5, 5, 5]), 0.1)
    torch.testing.assert_close(b, torch.tensor([-0.1, 0.1, 0.1, 0.1]))


def test_moe_layer_routes_with_its_bias_and_keeps_the_z_loss():
    torch.manual_seed(0)
    layer = moe.MoE(8, 16, n_experts=4, k=1)
    x = torch.randn(2, 6, 8)
    layer(x)
    assert layer.z_loss is not None and layer.z_loss.item() > 0
    layer.balance_bias = torch.tensor([0.0, 0.0, 10.0, 0.0])
    layer(x)
    assert layer.counts.sum().item() == 12 and layer.counts[0, 2].item() == 12


def test_train_refuses_negative_z_and_bias_rates_before_starting():
    import pytest

    from source_code.errors import LaunchError
    from source_code.expert_parallel import train
    for flag in ("--z-coef", "--bias-rate"):
        with pytest.raises(LaunchError, match=f"{flag} must be a number >= 0"):
            train.check(train.parse_args([flag, "-0.5"]), {})
