"""Notebook 13's other families and the overlap condition: the rates agree with the links of
notebook 18 (one datasheet, two places), the threshold is the root it claims, the head-count
refusal names the fix, on a one-process group every family is full attention with its
gradients, and on 3 processes every family equals full attention in bf16, fp32 and fp64, each
dtype within its own tolerance. The fp32 parity on 2 and 4 processes runs in notebook 13."""
import math

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from source_code.context_parallel import costs, families, family_check, harness, overlap, partial
from source_code.context_parallel.ring import ring_attention
from source_code.less_communication import links


def test_rates_are_the_datasheet_figures_notebook_18_uses():
    assert overlap.H100_BF16_FLOPS == links.H100_BF16_FLOPS
    by_bw = {bw: alpha for alpha, bw, _ in overlap.LINKS.values()}
    for name in ("node", "cluster"):
        assert by_bw[links.LINKS[name].beta] == links.LINKS[name].alpha


@pytest.mark.parametrize("alpha", [0.0, 5e-6, 1e-3])
def test_threshold_is_where_compute_meets_transfer(alpha):
    layer = overlap.Layer()
    f, g = overlap.flops_per_pair(layer), overlap.hop_bytes_per_token(layer)
    c = overlap.threshold(f, g, 1e15, 4e11, alpha)
    assert math.isclose(overlap.compute_s(c, f, 1e15), overlap.transfer_s(c, g, 4e11, alpha), rel_tol=1e-9)
    if alpha == 0:
        assert math.isclose(c, (g / f) * (1e15 / 4e11))
    assert overlap.compute_s(0.99 * c, f, 1e15) < overlap.transfer_s(0.99 * c, g, 4e11, alpha)


def test_slower_links_and_more_kv_heads_need_longer_blocks():
    rows = {(r["link"], r["phase"]): r["tokens"] for r in overlap.table()}
    mha = {(r["link"], r["phase"]): r["tokens"] for r in overlap.table(overlap.Layer(kv_heads=32))}
    for phase in ("forward", "backward"):
        assert rows[("InfiniBand NDR", phase)] > rows[("NVLink (H100 node)", phase)]
        assert mha[("InfiniBand NDR", phase)] > rows[("InfiniBand NDR", phase)]


def test_ulysses_refuses_heads_that_do_not_split():
    families.check_heads(8, 4)
    with pytest.raises(ValueError, match="6 heads do not divide over 4 ranks; use a number of ranks"):
        families.check_heads(6, 4)


def test_family_bytes_formulas():
    assert costs.allgather_bytes(100, 4) == {"forward": 600, "backward": 600}
    assert costs.ulysses_bytes(100, 4) == {"forward": 300, "backward": 300}


@pytest.fixture
def one_process_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("family", families.FAMILIES)
@pytest.mark.parametrize("causal", [True, False])
def test_each_family_on_one_process_is_full_attention(one_process_group, family, causal):
    g = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(1, 2, 8, 4, generator=g) for _ in range(4))
    mine = [t.clone().requires_grad_(True) for t in (q, k, v)]
    ref = [t.clone().requires_grad_(True) for t in (q, k, v)]
    families.attention(family, *mine, causal=causal, layout="zigzag").backward(dout)
    F.scaled_dot_product_attention(*ref, is_causal=causal).backward(dout)
    for a, b in zip(mine, ref):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-5, rtol=0)


def test_unknown_family_is_refused(one_process_group):
    x = torch.zeros(1, 2, 4, 4)
    with pytest.raises(ValueError, match="family must be one of"):
        families.attention("tree", x, x, x)


def test_every_family_equals_full_attention_in_bf16_fp32_and_fp64():
    """3 ranks: an odd count, and three contributions in every dK/dV sum the ring carries."""
    from source_code.processes import spawn
    shape = family_check.family_shape(harness.Shape(), 3)
    per_rank = spawn(family_check.dtype_parity, 3, shape, timeout=240, stream=False, device="cpu")
    for rank, rows in enumerate(per_rank):
        assert len(rows) == 3 * 2 * len(families.FAMILIES) * 2, len(rows)
        for row in rows:
            case = (rank, row["dtype"], row["family"], row["layout"], row["causal"])
            assert set(row["dtypes"].values()) == {row["dtype"]}, (case, row["dtypes"])
            for key, d in row["diffs"].items():
                assert d <= row["tols"][key], (case, key, d, row["tols"][key])


class Fp32Contributions:
    """The block attention with its dK/dV contributions rounded to fp32: what the ring did when
    it summed them in fp32 whatever the inputs' dtype."""
    attend = staticmethod(partial.attend)

    @staticmethod
    def attend_backward(*args):
        dq, dk, dv = partial.attend_backward(*args)
        return dq, dk.float().to(dk.dtype), dv.float().to(dv.dtype)


def test_fp64_tolerance_sees_gradients_rounded_to_fp32(one_process_group):
    g = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(1, 2, 8, 4, generator=g, dtype=torch.float64) for _ in range(4))
    ref = harness.full_attention(q, k, v, dout, True)
    for kernel, ok in ((partial, True), (Fp32Contributions, False)):
        local = [t.clone().requires_grad_(True) for t in (q, k, v)]
        ring_attention(*local, causal=True, layout="zigzag", kernel=kernel).backward(dout)
        d = harness.max_diff(local[1].grad, ref["dk"])
        assert (d <= harness.tolerance(torch.float64, ref["dk"])) == ok, (kernel, d)
