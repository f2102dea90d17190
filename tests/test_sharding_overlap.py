"""Reading overlap from a trace (fake events, no processes), the bf16 policy on the root only,
and what a bf16 running sum loses.

    python -m pytest tests/test_sharding_overlap.py
"""
import pytest
import torch

from source_code.sharding.overlap import transfer_and_compute
from source_code.profiling import classify


def _ev(name, ts, dur, tid, cat="cpu_op"):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "tid": tid, "cat": cat}


def test_hidden_time_is_transfer_under_main_thread_computation():
    trace = {"traceEvents": [
        _ev("ProfilerStep#1", 0, 100, tid=1, cat="user_annotation"),
        _ev("aten::mm", 0, 30, tid=1),                         # compute 0-30
        _ev("c10d::_allgather_base_", 30, 20, tid=1),          # the call: waits, not work
        _ev("aten::copy_", 35, 5, tid=1),                      # inside the call: not work
        _ev("aten::mm", 50, 30, tid=1),                        # compute 50-80
        _ev("autograd::engine::evaluate_function: AddBackward0", 85, 15, tid=1),  # holds a call:
        _ev("c10d::_allgather_base_", 86, 2, tid=1),           # waiting, not work
        _ev("gloo:all_gather", 20, 40, tid=7, cat="user_annotation"),    # in flight 20-60
        _ev("gloo:reduce_scatter", 90, 10, tid=7, cat="user_annotation"),  # 90-100, exposed
    ]}
    comm, comp = transfer_and_compute(trace)
    assert classify.busy_us(comm) == 50 and comp == [(0, 30), (50, 80)]
    assert classify.overlap_us(comm, comp) == 10 + 10      # 20-30 and 50-60
    gather, _ = transfer_and_compute(trace, "all_gather")
    assert gather == [(20, 60)]
    # only the events that start inside the given steps' windows
    comm, comp = transfer_and_compute(trace, windows=[(0, 50)])
    assert comm == [(20, 60)] and comp == [(0, 30)]


def test_bf16_policy_casts_only_the_root_output(monkeypatch):
    from source_code.sharding import fsdp
    seen = []
    monkeypatch.setattr(fsdp, "fully_shard", lambda module, **kw: seen.append((module, kw["mp_policy"])))
    model = fsdp.TransformerLM(dim=16, n_layers=2, n_heads=2)
    policy = fsdp.MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                       output_dtype=torch.float32)
    fsdp.shard_model(model, mesh=None, mp_policy=policy)
    assert [p.output_dtype for _, p in seen] == [None, None, torch.float32]
    assert seen[-1][0] is model and all(p.param_dtype == torch.bfloat16 for _, p in seen)


def test_a_bf16_running_sum_loses_the_terms_an_fp32_one_keeps():
    from source_code.sharding.fsdp_demo import running_sums
    r = running_sums(torch.full((2048,), 3.5))
    assert r["exact_mean"] == 3.5 and r["fp32_mean"] == 3.5 and r["rounded_once"] == 3.5
    # from 1024 on, bf16 numbers are 8 apart: adding 3.5 (< 8 / 2) leaves the sum where it is
    assert r["bf16_mean"] == 1024 / 2048 and r["lost"] > 1024 and r["spacing"] == 2 ** -6
