"""Notebook 14's shared experts and dropless routing, single-process: the shared experts add to
the routed output and are replicated (reduced like dense parameters); the expert-parallel layer
on a one-process gloo group equals the one-process MoE with them, dropless and with a capacity;
dropless dispatches every assignment where a capacity drops some of a skewed router's; the
capacity bounds any rank's receive buffer whatever the routing. The multi-process runs (world
sizes 2 and 4, the skewed receive buffers) run once, in notebook 14."""
import pytest
import torch
import torch.distributed as dist

from source_code.errors import LaunchError
from source_code.expert_parallel import compare, ep_dp, ep_layer, moe, router, train, wire


@pytest.fixture
def one_process_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def skewed_input(layer, tokens=48, dim=8, skew=3.0):
    """Tokens whose logit of expert 0 is raised by about ``skew`` (feature 0 about 1)."""
    torch.manual_seed(1)
    x = torch.randn(tokens, 1, dim)
    with torch.no_grad():
        x[..., 0] += 1.0
        layer.router.weight[0, 0] += skew
    return x


def test_shared_experts_add_to_the_routed_output_for_every_token():
    torch.manual_seed(0)
    layer = moe.MoE(8, 16, 4, k=2, capacity_factor=0.5, n_shared=2)
    x = torch.randn(2, 6, 8)
    rows = x.reshape(-1, 8)
    routed = moe.combine(rows, router.route(layer.router(rows), 2, 0.5), layer.experts)
    want = routed + layer.shared[0](rows) + layer.shared[1](rows)
    torch.testing.assert_close(layer(x).reshape(-1, 8), want)
    gone = (~router.route(layer.router(rows), 2, 0.5).keep).all(1)
    assert gone.any() and (layer(x).reshape(-1, 8)[gone] != 0).all()     # dropped: the shared ones still run
    c = moe.active_parameters(layer)
    assert c["shared"] == 2 * c["per_expert"] and c["per_token"] == c["router"] + 4 * c["per_expert"]


@pytest.mark.parametrize("bad", [-1, 1.5, True, "1"])
def test_moe_refuses_a_shared_count_that_is_not_a_whole_number(bad):
    with pytest.raises(ValueError, match="n_shared must be a whole number >= 0"):
        moe.MoE(8, 16, 4, k=1, n_shared=bad)


def test_shared_experts_are_reduced_like_dense_parameters():
    model = moe.moe_transformer({"vocab_size": 8, "dim": 8, "n_layers": 1, "n_heads": 2, "max_len": 8},
                                n_experts=4, n_shared=1)
    names = [n for n, _ in model.named_parameters()]
    shared = [n for n in names if ".shared." in n]
    assert shared and not any(ep_dp.is_expert(n) for n in shared)
    assert any(ep_dp.is_expert(n) for n in names)


@pytest.mark.parametrize("capacity_factor", [None, 1.0])
def test_ep_layer_with_a_shared_expert_equals_one_process(one_process_group, capacity_factor):
    torch.manual_seed(0)
    dense = moe.MoE(8, 16, 4, k=2, capacity_factor=capacity_factor, n_shared=1)
    x = skewed_input(dense)
    ep = ep_layer.EPMoE(dense)
    g = torch.randn_like(x)
    (dense(x) * g).sum().backward()
    (ep(x) * g).sum().backward()
    torch.testing.assert_close(ep(x), dense(x), atol=1e-6, rtol=0)
    for a, b in ((ep.shared, dense.shared), (ep.router, dense.router)):
        for p, q in zip(a.parameters(), b.parameters()):
            torch.testing.assert_close(p.grad, q.grad, atol=1e-6, rtol=0)


def test_dropless_dispatches_every_assignment_where_a_capacity_drops(one_process_group):
    dropped = {}
    for factor in (None, 1.0):
        torch.manual_seed(0)
        dense = moe.MoE(8, 16, 4, k=2, capacity_factor=factor)
        x = skewed_input(dense)
        with wire.recording() as calls:
            ep_layer.EPMoE(dense)(x)
        dropped[factor] = 2 * x.shape[0] - sum(calls.payload()[0]["send"])      # not carried
        reference = router.route(dense.router(x.reshape(-1, 8)), 2, factor)
        assert dropped[factor] == int((~reference.keep).sum())
    assert dropped[None] == 0 and dropped[1.0] > 0, dropped


@pytest.mark.parametrize("skew", [0.0, 2.0, 50.0])
def test_capacity_bounds_every_ranks_receive_buffer_whatever_the_routing(skew):
    world, tokens, n_experts, k, factor = 4, 16, 8, 2, 1.25
    torch.manual_seed(0)
    logits = torch.randn(world * tokens, n_experts)
    logits[:, :2] += skew                                 # experts 0 and 1: rank 0's
    r = router.route(logits, k, factor, groups=world)    # a rank's tokens are one group
    kept = router.tokens_per_expert(r.expert, n_experts, r.keep).view(world, -1).sum(1)   # rows each rank receives
    bound = ep_layer.receive_bound(tokens, n_experts, k, factor, world)
    assert bound == world * router.capacity(tokens, n_experts, k, factor) * (n_experts // world)
    assert int(kept.max()) <= bound, (kept, bound)
    if skew == 50.0:
        assert int(kept[0]) == bound                      # every group fills rank 0's experts to C
    everything = router.route(logits, k, None, groups=world)
    sent = router.tokens_per_expert(everything.expert, n_experts).view(world, -1).sum(1)
    assert int(sent.max()) <= ep_layer.receive_bound(tokens, n_experts, k, None, world) == world * tokens * k


def test_receive_bound_refuses_experts_that_do_not_split():
    with pytest.raises(ValueError, match="do not split evenly over 4 ranks"):
        ep_layer.receive_bound(16, 6, 2, 1.0, 4)


def test_compare_counts_what_the_dispatch_did_not_carry():
    def case(factor, send, skew=0.0):
        calls = [{"send": [8, 8]}, {"send": send, "recv": send}]
        return {"capacity_factor": factor, "skew": skew, "assignments": 32, "calls": calls}
    per_world = {2: [{"layers": [case(None, [8, 8]), case(1.0, [7, 6], skew=2.0)]},
                     {"layers": [case(None, [8, 8]), case(1.0, [8, 5], skew=2.0)]}]}
    assert compare.dropless_dropped(per_world) == 0
    assert compare.skewed_capacity_dropped(per_world) == 32 - 26
    assert compare.received(per_world[2], 1) == [13, 13]


def test_train_refuses_a_negative_shared_count():
    with pytest.raises(LaunchError, match="--shared-experts"):
        train.parse_args(["--shared-experts", "-1"])
