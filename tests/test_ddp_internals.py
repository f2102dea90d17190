"""The hand-made DDPs: bucket layout, equality with torch's DDP, no_sync accumulation."""
import re

import pytest
from torch import nn

from source_code.ddp_internals.bucketed import make_buckets


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


def test_naive_bucketed_and_torch_ddp_agree(torchrun):
    out = torchrun("source_code.ddp_internals.compare", "--steps", "8", "--warmup", "2", nproc=2).stdout
    diffs = [float(d) for d in re.findall(r"max_abs_diff\[[\w-]+\]=(\S+)", out)]
    assert len(diffs) == 3 and max(diffs) <= 1e-5
    times = dict(re.findall(r"compare: impl=(\w+) median_ms=(\S+)", out))
    assert set(times) == {"naive", "bucketed", "torch"} and all(float(t) > 0 for t in times.values())
    calls = {m[0]: int(m[1]) for m in re.findall(r"^(naive|bucketed)\s+\S+\s+\S+\s+\S+\s+(\d+)$", out, re.M)}
    assert calls["bucketed"] < calls["naive"] == 8  # 8 parameter tensors vs a few buckets


def test_no_sync_accumulation_equals_large_batch(torchrun):
    out = torchrun("source_code.ddp_internals.no_sync", "--k", "4", nproc=2).stdout
    rows = re.findall(r"no_sync: impl=(\w+) k=4 max_abs_diff=(\S+) allreduce_calls=(\d+) "
                      r"\(syncing every micro-batch: (\d+)\)", out)
    assert {r[0] for r in rows} == {"torch", "own"}
    for impl, diff, calls, every in rows:
        assert float(diff) <= 1e-5
        assert int(every) == 4 * int(calls)  # one synchronisation instead of k
