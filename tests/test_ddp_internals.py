"""The hand-made DDPs: bucket layout, equality with torch's DDP, no_sync accumulation."""
import re
import sys
from pathlib import Path

import pytest
from torch import nn

from source_code.ddp_internals.bucketed import make_buckets

sys.path.insert(0, str(Path(__file__).parent))
import spawned_main  # noqa: E402  tests/: an entry point's main in a rank of processes.spawn


def test_buckets_reverse_order_and_size():
    net = nn.Sequential(nn.Linear(100, 100), nn.Linear(100, 10), nn.Linear(10, 2))
    params = list(net.parameters())
    buckets = make_buckets(params, bucket_bytes=4 * 1000)
    flat = [p for b in buckets for p in b]
    assert [id(p) for p in flat] == [id(p) for p in reversed(params)]  # every parameter once, last first
    for b in buckets[:-1]:  # every bucket but the last reaches the size
        assert sum(p.numel() * 4 for p in b) >= 4000
    assert len(make_buckets(params, bucket_bytes=2**30)) == 1
    assert len(make_buckets(params, bucket_bytes=1)) == len(params)
    with pytest.raises(ValueError, match="bucket_mb"):
        make_buckets(params, 0)


def test_naive_bucketed_and_torch_ddp_agree():
    """compare's main on 2 forked ranks (under torchrun: notebook 05)."""
    from source_code.processes import spawn
    ranks = spawn(spawned_main.session_main, 2, "source_code.ddp_internals.compare", "--steps", 8, "--warmup", 2,
                  stream=False)
    assert [code for code, _ in ranks] == [0, 0]
    out = ranks[0][1]
    diffs = [float(d) for d in re.findall(r"max_abs_diff\[[\w-]+\]=(\S+)", out)]
    assert len(diffs) == 10 and max(diffs) <= 1e-5  # 5 implementations, every pair
    times = dict(re.findall(r"compare: impl=([\w-]+) median_ms=(\S+)", out))
    assert set(times) == {"naive", "no-overlap", "bucketed", "views", "torch"}
    assert all(float(t) > 0 for t in times.values())
    ratios = dict(re.findall(r"compare: impl=([\w-]+) median_ms=\S+ ratio_to_torch=(\S+)", out))
    assert set(ratios) == set(times) - {"torch"} and all(float(r) > 0 for r in ratios.values())
    calls = {m[0]: int(m[1]) for m in re.findall(r"^([\w-]+)\s+\S+\s+\S+\s+\S+\s+(\d+)$", out, re.M)}
    assert calls["bucketed"] == calls["no-overlap"] == calls["views"] < calls["naive"] == 8  # tensors vs buckets


def test_gradient_views_live_in_the_bucket_buffers_and_equal_the_copies():
    from source_code.processes import spawn
    res = spawn(_views_vs_copies, 2, device="cpu")
    assert all(r["views_in_buffer"] and r["max_diff"] == 0.0 for r in res), res


def _views_vs_copies():
    import torch
    import torch.nn.functional as F
    from source_code.ddp_internals.bucketed import BucketedDDP
    import torch.distributed as dist
    grads = {}
    for views in (False, True):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
        model = BucketedDDP(net, bucket_mb=0.0001, grad_views=views)
        torch.manual_seed(1 + dist.get_rank())
        for _ in range(2):  # two steps: the views are re-attached after zero_grad(set_to_none=True)
            net.zero_grad(set_to_none=True)
            F.cross_entropy(model(torch.randn(5, 6)), torch.randint(0, 3, (5,))).backward()
        grads[views] = [p.grad.clone() for p in net.parameters()]
        if views:
            buffers = {t.untyped_storage().data_ptr() for t in model._flat}
            in_buffer = all(p.grad.untyped_storage().data_ptr() in buffers for p in net.parameters())
    return {"views_in_buffer": in_buffer,
            "max_diff": max((a - b).abs().max().item() for a, b in zip(grads[False], grads[True]))}


# no_sync accumulation (k = 4 micro-batches equal the large batch, one all-reduce instead of 4):
# notebook 05 runs source_code.ddp_internals.no_sync and asserts both, for torch's DDP and ours.


def test_own_wrappers_train_in_torch_ddps_loop_and_stop_on_an_unused_parameter():
    from source_code.processes import spawn
    res = spawn(_same_loop_and_unused, 2, device="cpu")
    for r in res:
        assert r["max_diff_to_torch"] <= 1e-6, r
        assert all("gave 2 of 6 parameters no gradient" in e for e in r["errors"]), r


def _same_loop_and_unused():
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    from source_code.ddp_internals.bucketed import BucketedDDP
    from source_code.ddp_internals.naive import NaiveDDP

    def step(model, opt, x, y):  # torch's DDP loop, unchanged for every wrapper
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    weights, errors = {}, []
    for name, wrap in (("torch", DDP), ("naive", NaiveDDP), ("bucketed", BucketedDDP)):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3), nn.Linear(3, 3))
        model = wrap(net)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        torch.manual_seed(1 + dist.get_rank())  # each rank its own batches
        for _ in range(3):
            step(model, opt, torch.randn(5, 6), torch.randint(0, 3, (5,)))
        weights[name] = [p.detach().clone() for p in net.parameters()]
        if name != "torch":  # the last layer unused: backward leaves 2 of 6 parameters without a gradient
            x = torch.randn(5, 6)
            F.cross_entropy(net[:3](x), torch.randint(0, 3, (5,))).backward()
            try:
                model(x)
            except RuntimeError as err:
                errors.append(str(err))
            else:
                errors.append("no error")
    diff = max((a - b).abs().max().item() for name in ("naive", "bucketed")
               for a, b in zip(weights[name], weights["torch"]))
    return {"max_diff_to_torch": diff, "errors": errors}
