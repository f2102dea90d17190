"""Context parallelism's single-process pieces: the layouts and their work, the partial attention
and its merge against full attention, the bytes formula, the entry point's refusals. The
multi-process parity (2 and 4 ranks, both layouts, causal or not) runs once, in notebook 13,
which asserts the goals."""
import math

import pytest
import torch
import torch.nn.functional as F

from source_code.context_parallel import compare, costs, layout as lay
from source_code.context_parallel.memory import check_width
from source_code.context_parallel.merge import merge
from source_code.context_parallel.partial import attend, attend_backward
from source_code.context_parallel.ring import ring_attention
from source_code.errors import LaunchError


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("layout", lay.LAYOUTS)
def test_layout_partitions_and_round_trips(world, layout):
    seq = 8 * world
    idx = torch.cat([lay.token_index(seq, r, world, layout) for r in range(world)])
    assert sorted(idx.tolist()) == list(range(seq))
    x = torch.randn(2, 3, seq, 4)
    assert torch.equal(lay.unshard([lay.shard(x, r, world, layout) for r in range(world)], layout), x)


def test_zigzag_balances_causal_work_and_contiguous_does_not():
    for world in (2, 4, 8):
        seq = 16 * world
        for layout in lay.LAYOUTS:
            work = lay.work_per_rank(seq, world, layout, causal=True)
            assert sum(work) == seq * (seq + 1) // 2         # every visible pair once
        assert lay.imbalance(lay.work_per_rank(seq, world, "zigzag", True)) == 1.0
        assert lay.imbalance(lay.work_per_rank(seq, world, "contiguous", True)) > 2 * world - 2
        assert lay.imbalance(lay.work_per_rank(seq, world, "contiguous", False)) == 1.0


def test_length_that_does_not_divide_is_refused_with_the_padding():
    with pytest.raises(ValueError, match="not a multiple of 8.*pad the batch to 56"):
        lay.check_length(50, 4, "zigzag")
    assert lay.check_length(52, 4, "contiguous") == 13


@pytest.mark.parametrize("causal", [True, False])
def test_partial_attention_merged_and_its_backward_equal_full_attention(causal):
    torch.manual_seed(0)
    q, k, v, dout = (torch.randn(2, 2, 12, 4, dtype=torch.float64) for _ in range(4))
    size, scale = 3, 1 / math.sqrt(4)
    qr, kr, vr = (t.clone().requires_grad_(True) for t in (q, k, v))
    ref = F.scaled_dot_product_attention(qr, kr, vr, is_causal=causal)
    ref.backward(dout)
    kinds = lambda qc, kc: None if causal and kc > qc else (causal and kc == qc)  # noqa: E731
    outs, lses = [], []
    for qc in range(4):
        acc = (None, None)
        for kc in range(4):
            if kinds(qc, kc) is not None:
                acc = merge(*acc, *attend(q[:, :, qc * size:(qc + 1) * size], k[:, :, kc * size:(kc + 1) * size],
                                          v[:, :, kc * size:(kc + 1) * size], scale, kinds(qc, kc)))
        outs.append(acc[0])
        lses.append(acc[1])
    out, lse = torch.cat(outs, 2), torch.cat(lses, 2)
    assert torch.allclose(out, ref.detach(), atol=1e-12)
    dq, dk, dv = (torch.zeros_like(t) for t in (q, k, v))
    c = lambda t, i: t[:, :, i * size:(i + 1) * size]  # noqa: E731
    for qc in range(4):
        for kc in range(4):
            if kinds(qc, kc) is not None:
                g = attend_backward(c(q, qc), c(k, kc), c(v, kc), c(out, qc), c(lse, qc), c(dout, qc),
                                    scale, kinds(qc, kc))
                c(dq, qc).add_(g[0])
                c(dk, kc).add_(g[1])
                c(dv, kc).add_(g[2])
    for mine, theirs in ((dq, qr.grad), (dk, kr.grad), (dv, vr.grad)):
        assert torch.allclose(mine, theirs, atol=1e-12)


def test_merge_is_stable_where_exp_overflows():
    out, lse = merge(torch.ones(1, 1, 1, 2), torch.full((1, 1, 1), 1000.0),
                     torch.zeros(1, 1, 1, 2), torch.full((1, 1, 1), 1000.0))
    assert (out - 0.5).abs().max() < 1e-6 and (lse - (1000 + math.log(2))).abs().max() < 1e-4


def test_bytes_formula():
    assert costs.ring_bytes(100, 1) == {"forward": 0, "backward": 0}
    assert costs.ring_bytes(100, 4) == {"forward": 600, "backward": 600 + 800}
    assert costs.ring_bytes(100, 4, grad_bytes=200) == {"forward": 600, "backward": 600 + 1600}


def test_mesh_traffic_sends_dk_dv_in_fp32():
    """bf16 K/V (M bytes each per rank) and fp32 dK/dV (2M): (n-1) 2M + (n-1) 2M + n 4M."""
    rows = costs.mesh_traffic(batch=1, seq=1024, dim=256, heads=8, kv_heads=2, params_per_layer=10**6,
                              dp=1, cp=4, tp=1)
    m = 1 * (1024 // 4) * 2 * 32 * 2
    cp = next(r for r in rows if r["dim"] == "CP")
    assert cp["bytes"] == 3 * 2 * m + 3 * 2 * m + 4 * 2 * (2 * m) and "fp32" in cp["what"]


@pytest.mark.parametrize("argv, message", [
    (["--seq", "50"], "pad the batch to 52"),
    (["--worlds", "1"], "at least 2"),
    (["--worlds", "two"], "comma-separated"),
    (["--seq", "0"], "positive integer"),
    (["--seq", "-8"], "positive integer"),
    (["--seq", "many"], "not a number"),
])
def test_entry_point_refuses_before_starting_processes(argv, message):
    with pytest.raises(LaunchError, match=message):
        compare.main(argv)


def test_entries_computed_count_diagonal_blocks_whole():
    assert layout_entries(1024, 2, "contiguous") == [512 * 512, 2 * 512 * 512]
    assert layout_entries(1024, 2, "zigzag") == [5 * 256 * 256] * 2


def layout_entries(seq, world, name):
    return lay.entries_per_rank(seq, world, name, causal=True)


@pytest.mark.parametrize("seq, message", [(0, "positive length"), (-8, "positive length")])
def test_lengths_that_are_not_positive_are_refused(seq, message):
    with pytest.raises(ValueError, match=message):
        lay.check_length(seq, 4, "zigzag")


def test_ring_attention_refuses_an_odd_local_length_under_zigzag():
    q = torch.randn(1, 2, 7, 4)
    with pytest.raises(ValueError, match="holds 7 tokens.*multiple of 2.*pad the sequence"):
        ring_attention(q, q, q, layout="zigzag")
    with pytest.raises(ValueError, match="one shape"):
        ring_attention(q, q[:, :1], q[:, :1])


@pytest.mark.parametrize("dim, heads", [(65, 4), (64, 0), (0, 4)])
def test_a_width_the_heads_do_not_divide_is_refused(dim, heads):
    with pytest.raises(ValueError, match="does not split into .* heads: choose"):
        check_width(dim, heads)
