"""Profiling helpers without processes: operator classification, trace reading, FLOP counts,
scaling efficiency, the flight-recorder comparison, the monitor."""
import io
import json
import os

import pytest
import torch

from source_code import device_policy, models
from source_code.profiling import classify, flight_recorder, hang, mfu, monitor, scaling


@pytest.mark.parametrize("name, kind", [
    ("gloo:all_reduce", "communication"), ("c10d::allreduce_", "communication"),
    ("nccl:all_reduce", "communication"), ("record_param_comms", "communication"),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "communication"), ("gloo:barrier", "communication"),
    ("aten::mm", "computation"), ("aten::convolution_backward", "computation"),
    ("ProfilerStep#3", "annotation"), ("ProfilerStep*", "annotation"),
    ("DistributedDataParallel.forward", "annotation"), ("Optimizer.step#SGD.step", "annotation"),
])
def test_kind_of(name, kind):
    assert classify.kind_of(name) == kind


def test_merge_and_trace_intervals():
    assert classify.merge([(5, 6), (0, 2), (1, 3)]) == [(0, 3), (5, 6)]
    trace = {"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 10},
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": 5, "dur": 10},
        {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "ts": 12, "dur": 8},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 20},
        {"ph": "X", "cat": "python_function", "name": "forward", "ts": 0, "dur": 30}]}
    got = classify.intervals(trace)
    assert got == {"computation": [(0, 15)], "communication": [(12, 20)]}
    assert classify.step_windows(trace) == [(0, 20)]
    # with GPU activity only what ran on the GPU counts (the host's events are launches)
    trace["traceEvents"] += [
        {"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x64_nn", "ts": 3, "dur": 4},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "ts": 1, "dur": 1},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "ts": 6, "dur": 10}]
    assert classify.intervals(trace) == {"computation": [(1, 2), (3, 7)], "communication": [(6, 16)]}


def test_matmul_count_by_hand():
    # L=2, d=64, V=32: weights 2 * (4 + 8) * 64^2 + 64 * 32 = 100352; B=4, T=16: 64 tokens
    assert mfu.matmul_weights(2, 64, 32) == 100_352
    # 6 * 100352 * 64 + 12 * L * B * T^2 * d = 38,535,168 + 1,572,864
    assert mfu.transformer_flops(2, 64, 32, 4, 16) == 40_108_032


def test_flop_counter_counts_model_and_attention_flops_on_any_device():
    """torch's FlopCounterMode, with the math attention kernel, counts the weight matmuls as
    6 N (B T) and attention as 12 L B T^2 d (the full T x T, not halved for the causal mask)."""
    torch.manual_seed(0)
    L, d, V, B, T = 3, 96, 50, 2, 32
    model = models.TransformerLM(vocab_size=V, dim=d, n_layers=L, n_heads=3, max_len=T)
    got = mfu.counted_flops(model, torch.randint(0, V, (B, T)))
    assert got["weights"] == mfu.model_flops(L, d, V, B, T) == 6 * mfu.matmul_weights(L, d, V) * B * T
    assert got["attention"] == mfu.attention_flops(L, d, B, T) == 12 * L * B * T * T * d
    assert got["total"] == mfu.transformer_flops(L, d, V, B, T)
    assert mfu.attention_flops(L, d, B, T, causal_skip=True) * 2 == got["attention"]
    with torch.device("meta"):  # no kernel runs: the same count from shapes alone
        meta = models.TransformerLM(vocab_size=V, dim=d, n_layers=L, n_heads=3, max_len=T)
        assert mfu.counted_flops(meta, torch.randint(0, V, (B, T)))["total"] == got["total"]


def test_datasheet_peaks_and_which_row_a_device_gets(monkeypatch):
    assert mfu.datasheet_row("NVIDIA H100 80GB HBM3") == "H100 SXM"
    assert mfu.datasheet_row("NVIDIA H200") == "H100 SXM"   # same chip and peaks, more memory
    assert mfu.datasheet_row("NVIDIA A100-SXM4-80GB") == "A100"
    assert mfu.datasheet_row("AMD Instinct MI250X") == "MI250X GCD"
    assert mfu.datasheet_row("NVIDIA H100 PCIe") is None  # another part: not the SXM's peak
    assert mfu.datasheet_peak("cpu", False) == (None, None)
    # the 40 % goal: against the H100 SXM's dense bf16 peak
    assert mfu.DATASHEET[mfu.GOAL["gpu"]][mfu.GOAL["format"]] == 989.4e12
    assert mfu.DATASHEET["MI250X GCD"]["tf32"] is None and "| MI250X GCD | 191.5 | none | 47.9 |" in mfu.datasheet_table()
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    before = torch.backends.cuda.matmul.allow_tf32  # a property of torch's: set and restored by hand
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        assert mfu.datasheet_peak("cuda", True) == ("H100 SXM", 989.4e12)
        assert mfu.datasheet_peak("cuda", False) == ("H100 SXM", 494.7e12)  # float32 on tensor cores: TF32
        torch.backends.cuda.matmul.allow_tf32 = False
        assert mfu.datasheet_peak("cuda", False) == ("H100 SXM", 66.9e12)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def test_mfu_measure_small():
    r = mfu.measure(dim=64, layers=1, seq=16, batch=2, vocab=32, steps=2)
    assert r["flops_per_step"] == mfu.transformer_flops(1, 64, 32, 2, 16) == r["model_flops"] + r["attention_flops"]
    assert 0 < r["mfu"] == pytest.approx(r["achieved_flops"] / r["peak_flops"])
    assert r["datasheet"] is None and r["mfu_datasheet"] is None  # a CPU: only the measured peak
    assert "no datasheet peak for this device" in mfu.describe(r)


def test_scaling_efficiency_formulas():
    # strong: one process 100 ms per step, two 60 ms for the same global batch
    assert scaling.strong_efficiency(0.100, 0.060, 2) == pytest.approx(100 / 120)
    # weak: two processes do twice the work in 125 ms instead of 100 ms
    assert scaling.weak_efficiency(0.100, 0.125) == pytest.approx(0.8)
    assert scaling.throughput_efficiency(1000, 1600, 2) == pytest.approx(0.8)
    result = {"strong": {1: {"samples_per_s": 1000.0}, 2: {"samples_per_s": 1500.0}},
              "weak": {1: {"samples_per_s": 1000.0}, 2: {"samples_per_s": 1800.0}}}
    assert scaling.efficiencies(result) == {"strong": {1: 1.0, 2: 0.75}, "weak": {1: 1.0, 2: 0.9}}
    # from CPU time per step: one process 40 ms for 64 samples; two 25 ms each for 32 (strong),
    # 50 ms each for 64 (weak)
    cpu = {"strong": {1: {"step_cpu_ms": 40.0}, 2: {"step_cpu_ms": 25.0}},
           "weak": {1: {"step_cpu_ms": 40.0}, 2: {"step_cpu_ms": 50.0}}}
    assert scaling.cpu_efficiencies(cpu) == {"strong": {1: 1.0, 2: 0.8}, "weak": {1: 1.0, 2: 0.8}}


def test_scaling_keeps_the_fastest_round_and_compares_cpu_round_by_round(monkeypatch):
    # two rounds; the round fastest on the clock is neither the one with the least CPU per step
    # nor the one the CPU ratios come from: they pair the runs of one round, then take the median
    rounds = iter([(1000.0, 12.0), (1800.0, 10.0), (1400.0, 6.0),     # round 1: 1 weak, 2 weak, 2 strong
                   (1100.0, 13.0), (1700.0, 9.5), (1500.0, 7.0)])     # round 2
    monkeypatch.setattr(scaling, "table_device", lambda procs: ("cpu", "device: cpu"))

    def fake_spawn(fn, nproc, argv, **kwargs):
        sps, cpu_ms = next(rounds)
        return [{"samples_per_s": sps, "step_cpu_ms": cpu_ms}] * nproc
    monkeypatch.setattr(scaling.processes, "spawn", fake_spawn)
    result = scaling.run((1, 2), batch=64, steps=2, repeats=2)
    assert [result[k][2]["samples_per_s"] for k in ("weak", "strong")] == [1800.0, 1500.0]
    assert result["weak"][1]["samples_per_s"] == 1100.0 and result["strong"][1] is result["weak"][1]
    assert {k: result[k][2]["round_step_cpu_ms"] for k in ("weak", "strong")} == {"weak": [10.0, 9.5],
                                                                                 "strong": [6.0, 7.0]}
    eff = scaling.cpu_efficiencies(result)
    assert eff["weak"] == {1: 1.0, 2: pytest.approx((12 / 10 + 13 / 9.5) / 2)}
    assert eff["strong"] == {1: 1.0, 2: pytest.approx((12 / 12 + 13 / 14) / 2)}
    assert scaling.cpu_ratio(result["strong"][2], result["weak"][2]) == pytest.approx((6 / 10 + 7 / 9.5) / 2)


def _entry(seq, name, sizes):
    return {"pg_id": 0, "collective_seq_id": seq, "profiling_name": name, "input_sizes": sizes,
            "input_dtypes": ["Float"]}


def test_flight_recorder_names_the_first_mismatch():
    r0 = {"entries": [_entry(i, "gloo:all_reduce", [[1000]]) for i in (1, 2, 3)]}
    r1 = {"entries": [_entry(1, "gloo:all_reduce", [[1000]]), _entry(2, "gloo:all_reduce", [[1000]]),
                      _entry(3, "gloo:barrier", [])]}
    mm = flight_recorder.first_mismatch({0: r0, 1: r1})
    assert mm["index"] == 3
    assert "gloo:all_reduce [1000]" in mm["per_rank"][0] and "gloo:barrier" in mm["per_rank"][1]
    assert flight_recorder.first_mismatch({0: r0, 1: json.loads(json.dumps(r0))}) is None
    short = {"entries": r0["entries"][:2]}
    assert flight_recorder.first_mismatch({0: r0, 1: short})["per_rank"][1].startswith("nothing")


def test_recorders_that_agree_under_detail_do_not_send_you_after_a_slow_rank():
    """DETAIL stops every rank before the mismatched call: the recorders agree, and the drill
    says why instead of the advice agreeing recorders give without DETAIL."""
    same = {"entries": [_entry(i, "gloo:all_reduce", [[1000]]) for i in (1, 2)]}
    dumps = {0: same, 1: json.loads(json.dumps(same))}
    plain = hang.recorder_report(dumps, stopped_by_detail=False)
    assert "a rank that is slow" in plain
    detail = hang.recorder_report(dumps, stopped_by_detail=True)
    assert "a rank that is slow" not in detail
    assert "the recorders agree because DETAIL stopped the ranks before the mismatched call" in detail
    # recorders that differ are reported as they are, with or without DETAIL
    other = {"entries": [_entry(1, "gloo:all_reduce", [[1000]]), _entry(2, "gloo:barrier", [])]}
    assert hang.recorder_report({0: same, 1: other}, True) == flight_recorder.report({0: same, 1: other})


def test_gpu_utilisation_without_and_with_a_tool(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert monitor.gpu_utilisation().startswith("not available here")
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho '0, NVIDIA H100 80GB HBM3, 97, 61234, 81559'\n")
    fake.chmod(0o755)
    assert monitor.gpu_utilisation() == "GPU 0 (NVIDIA H100 80GB HBM3): 97 % busy, 61234 / 81559 MiB"


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_only_on_a_terminal():
    plain, tty = io.StringIO(), _Tty()
    for stream in (plain, tty):
        p = monitor.Progress(4, every=2, stream=stream)
        for step in range(1, 5):
            p.update(step, 10 * step)
        p.close()
    assert "[" not in plain.getvalue() and plain.getvalue().count("\n") == 2  # steps 2 and 4
    assert "\r[" in tty.getvalue() and "#" * 30 in tty.getvalue()
    silent = io.StringIO()
    monitor.Progress(4, enabled=False, stream=silent).update(4, 40)
    assert silent.getvalue() == ""


def test_hang_drill_is_pinned_to_the_cpu_and_says_so_where_a_gpu_is(monkeypatch):
    """On a GPU node the drill would mix gloo all-reduces with an NCCL barrier: it asks the device
    policy for the CPU (WORKSHOP_DEVICE=cpu) and prints why where that overrides a GPU."""
    monkeypatch.setenv("WORKSHOP_DEVICE", "auto")  # restored after the test
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    note = hang.pin_to_cpu()
    assert os.environ["WORKSHOP_DEVICE"] == "cpu" and "on purpose" in note and "NCCL" in note
    gpus = device_policy.Gpus(True, 2, (9, 0), "H100", ("sm_90",))
    placed = device_policy.choose(0, 2, gpus=gpus)
    assert (placed.device.type, placed.backend) == ("cpu", "gloo")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert hang.pin_to_cpu() == ""  # a CPU machine: nothing to explain


def test_flight_recorder_reads_each_backends_own_recorder(monkeypatch):
    import torch._C._distributed_c10d as c10d
    monkeypatch.setattr(c10d, "_dump_fr_trace_json", lambda *a: json.dumps({"entries": ["gloo"]}), raising=False)
    monkeypatch.setattr(c10d, "_dump_nccl_trace_json", lambda *a: json.dumps({"entries": ["nccl"]}), raising=False)
    assert flight_recorder.dump() == {"entries": ["gloo"]}
    assert flight_recorder.dump("nccl") == {"entries": ["nccl"]}


class _Ev:
    """What classify reads of a FunctionEventAvg; ``dev_attr`` names the device time as this
    torch does (self_device_time_total; self_cuda_time_total in older releases)."""

    def __init__(self, key, cpu_self, cpu_total, device_us=0, kernel=False, dev_attr="self_device_time_total"):
        from torch.autograd import DeviceType
        self.key, self.count = key, 1
        self.self_cpu_time_total, self.cpu_time_total = cpu_self, cpu_total
        self.device_type = DeviceType.CUDA if kernel else DeviceType.CPU
        setattr(self, dev_attr, device_us)


def _gpu_profile(dev_attr):
    ev = lambda *a, **k: _Ev(*a, **k, dev_attr=dev_attr)  # noqa: E731
    return [ev("aten::mm", 900, 1000, device_us=3000),          # launched the gemm below
            ev("nccl:all_reduce", 0, 5000),                       # host-side span of the collective
            ev("c10d::allreduce_", 400, 450),
            ev("ProfilerStep*", 2000, 9000),
            ev("ampere_sgemm_128x64_nn", 0, 0, device_us=3000, kernel=True),
            ev("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 0, 0, device_us=7000, kernel=True)]


@pytest.mark.parametrize("dev_attr", ["self_device_time_total", "self_cuda_time_total"])
def test_split_uses_gpu_time_when_cuda_activity_was_recorded(dev_attr):
    rows = classify.op_rows(_gpu_profile(dev_attr))
    assert classify.clock(rows) == "device"
    # each kernel once: the gemm's 3 ms are not counted again on aten::mm, the host's launch
    # times (0.9 ms, 0.4 ms) and gloo-style "in flight" spans do not count at all
    assert classify.totals(rows) == {"computation": 3.0, "communication": 7.0, "annotation": 0.0}
    mm = next(r for r in rows if r["name"] == "aten::mm")
    assert mm["time_ms"] == 0 and mm["self_device_ms"] == 3.0 and mm["self_ms"] == 0.9
    assert "GPU time" in classify.format_table(rows)


def test_split_without_kernel_rows_counts_the_operators_device_time():
    rows = classify.op_rows([_Ev("aten::mm", 900, 1000, device_us=3000), _Ev("nccl:all_reduce", 10, 20, device_us=500)])
    assert classify.clock(rows) == "device"
    assert classify.totals(rows) == {"computation": 3.0, "communication": 0.5, "annotation": 0.0}


def test_split_on_the_cpu_is_host_self_time():
    rows = classify.op_rows([_Ev("aten::mm", 900, 1000), _Ev("gloo:all_reduce", 0, 5000),
                             _Ev("c10d::allreduce_", 400, 450)])
    assert classify.clock(rows) == "host"
    assert classify.totals(rows) == {"computation": 0.9, "communication": 5.4, "annotation": 0.0}
    assert "host self time" in classify.format_table(rows)


def test_profile_ddp_step_time_waits_for_the_gpu(monkeypatch):
    from source_code.profiling import profile_ddp
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: calls.append(a))
    profile_ddp.finished(torch.device("cpu"))
    assert calls == []
    profile_ddp.finished(torch.device("cuda", 1))
    assert calls == [(torch.device("cuda", 1),)]


def test_step_breakdown_reads_per_step_means_from_a_trace():
    """Two steps of 10 us on the main thread (tid 1); gloo's all-reduce on tid 2. Step 1: an op
    0-4, the all-reduce 3-9, the main thread idle 4-10 (waiting 4-9). Step 2: an op 10-18."""
    ev = lambda name, ts, dur, tid=1, cat="cpu_op": {"ph": "X", "name": name, "ts": ts, "dur": dur,  # noqa: E731
                                                     "tid": tid, "cat": cat}
    trace = {"traceEvents": [ev("ProfilerStep#2", 0, 10, cat="user_annotation"),
                             ev("ProfilerStep#3", 10, 10, cat="user_annotation"),
                             ev("aten::mm", 0, 4), ev("gloo:all_reduce", 3, 6, tid=2, cat="user_annotation"),
                             ev("aten::mm", 10, 8), ev("aten::add", 25, 5)]}  # after the steps: left out
    got = classify.step_breakdown(trace)
    want = {"steps": 2, "step": 10.0, "computing": 6.0, "communicating": 3.0, "overlap": 0.5,
            "main_idle": 4.0, "main_idle_comm": 2.5}
    assert got == pytest.approx({k: v / 1e3 if k != "steps" else v for k, v in want.items()})
    assert classify.overlap_us([(0, 4), (6, 8)], [(2, 7)]) == 3
    assert classify.gaps([(0, 10)], [(2, 3), (5, 12)]) == [(0, 2), (3, 5)]


def test_per_step_divides_calls_and_times():
    rows = classify.op_rows([_Ev("aten::mm", 900, 1000), _Ev("gloo:all_reduce", 0, 6000)])
    rows[0]["calls"] = 6
    per = classify.per_step(rows, 3)
    assert per[0]["calls"] == 2 and per[0]["time_ms"] == pytest.approx(2.0)
    assert classify.totals(per) == pytest.approx({"computation": 0.3, "communication": 2.0, "annotation": 0.0})
    assert "(ms per step)" in classify.format_table(per, unit="ms per step")


def test_loader_figure_names_the_all_reduce_only_with_several_processes():
    import matplotlib
    matplotlib.use("Agg")
    from source_code.profiling import figures
    run = {"data_wait_ms": 5.0, "step_ms": 8.0, "samples_per_s": 100.0}
    for world, named in ((1, False), (2, True)):
        fig = figures.loader_figure({"a": {**run, "world_size": world}})
        labels = fig.axes[0].get_legend_handles_labels()[1]
        assert ("all-reduce" in " ".join(labels)) is named and any("optimizer step" in x for x in labels)


def test_detail_fingerprints_own_first_then_the_other_ranks():
    msg = ("Detected mismatch between collectives on ranks. Rank 0 is running collective: "
           "CollectiveFingerPrint(SequenceNumber=5, OpType=ALLREDUCE, TensorShape=[1000], TensorDtypes=Float), "
           "but Rank 1 is running collective: CollectiveFingerPrint(SequenceNumber=0OpType=REDUCE).")
    assert hang.fingerprints(msg) == [{"rank": 0, "seq": 5, "op": "ALLREDUCE"}, {"rank": 1, "seq": 0, "op": "REDUCE"}]
    assert hang.fingerprints("Timed out waiting 5000ms for recv operation to complete") == []
