"""Memory, precision and recomputation (source_code/memory/, notebook 08).

The counted activation bytes equal the formula's term by term; the calculator and the planner
give the same bytes, and name the bf16 bookkeeping they assume; the precisions' bytes per
parameter counted (Megatron-LM's 18, 6 + 12/d with its distributed optimizer; FSDP2's fp32
shards on 2 processes); GradScaler's underflow and overflow; the formats' mantissa bits;
recomputation keeps the gradients and lowers the peak, and selective recomputation drops the
s x s scores of an unfused attention for a third of full's recomputed FLOPs; accumulation; the
entry points' summary lines and their refusals of bad flags (exit status 2, one line).
"""
import importlib

import pytest
import torch

from source_code import processes, workload
from source_code.errors import run_main
from source_code.memory import (accumulation, calculator, formula, fsdp_bf16, mixed_precision,
                                precision, recompute, report)
from source_code.memory.live import LiveBytes
from source_code.models import TransformerLM
from source_code.planner import memory as planner_memory
from source_code.planner import mesh_memory
from source_code.planner.spec import PRECISIONS, PRESETS, Config


@pytest.mark.parametrize("config", report.CONFIGS, ids=lambda c: c[-1] + str(c[2]))
def test_counted_activations_equal_the_formula(config):
    r = report.counted_activations(*config)
    assert r["counted"] == r["formula"], r


def test_korthikanti_differences_add_up():
    b, s, h, a = 2, 128, 64, 4
    ours = b * s * formula.block_bytes_per_token(h, a, mode="bf16")
    rule = formula.korthikanti_block_bytes(b, s, h, a)
    assert rule - ours == pytest.approx(sum(formula.korthikanti_differences(b, s, h, a).values()))
    counted = report.block16(b, s, h, a)["counted"]
    assert counted == ours


def test_planner_uses_the_calculator():
    m = PRESETS["7b"]
    for zero, ckpt in ((0, False), (1, True), (3, False)):
        cfg = Config(dp=8, zero=zero, micro_batch=1, checkpointing=ckpt)
        plan = mesh_memory.per_gpu(m, cfg, "bf16")
        calc = calculator.training_memory(m.params(), m.layers, m.hidden, m.heads, m.vocab, 1, m.seq,
                                          "bf16", zero, 8, ckpt, device="cuda", loss_bytes=2)
        for k in ("params", "grads", "optimizer", "buffers"):
            assert plan[k] == calc[k], k
        assert calc["activations"] - plan["activations"] == 8 * m.seq + 4   # positions, loss weight
    assert PRECISIONS["bf16"] is calculator.PRECISIONS["bf16"]
    assert planner_memory.state_bytes(1000, 4, "zero2", step_bytes=0) == calculator.state_bytes(1000, 4, 2)


def test_bytes_per_parameter():
    per = precision.per_parameter()
    assert per["fp32"] == {"params": 4, "grads": 4, "optimizer": 8, "total": 16}
    assert per["bf16-mixed"] == {"params": 2, "grads": 2, "optimizer": 12, "total": 16}
    assert per["bf16-megatron"] == {"params": 2, "grads": 4, "optimizer": 12, "total": 18}
    assert per["fp16-scaler"]["params"] == 4 and 16 < per["fp16-scaler"]["total"] < 16.01  # + the scale
    assert per["bf16-pure"]["total"] == 8


@pytest.mark.parametrize("dp", [1, 2, 4, 8])
def test_megatron_counted_matches_the_calculator(dp):
    """Megatron-LM's distributed optimizer is ZeRO-1 with fp32 gradients: 6 + 12/d, counted."""
    b = mixed_precision.megatron_step_bytes(workload.model_config(dim=32, n_layers=1), dp)
    n = b["n_params"]
    calc = calculator.state_bytes(n, dp, 1 if dp > 1 else 0, "bf16-megatron")
    assert (b["params"], b["grads"], b["optimizer"]) == (calc["params"], calc["grads"], calc["optimizer"])
    assert b["total"] / n == pytest.approx(6 + 12 / dp, abs=12 / n)
    assert b["loss_dtype"] == "torch.float32"


def test_calculator_refuses_what_it_cannot_size():
    with pytest.raises(ValueError, match="not divisible by heads"):
        calculator.training_memory(1000, 2, 30, 4, 32, 1, 16)
    with pytest.raises(ValueError, match="positive integer"):
        calculator.training_memory(1000, 2, 32, 4, 32, 0, 16)
    with pytest.raises(ValueError, match="unknown precision"):
        calculator.training_memory(1000, 2, 32, 4, 32, 1, 16, precision="bf17")


def test_precisions_name_their_bookkeeping():
    for name in ("bf16", "bf16-megatron", "bf16-fsdp2"):
        assert name in PRECISIONS and PRECISIONS[name].accounting     # the planner offers each
    assert "ZeRO" in PRECISIONS["bf16"].accounting and "Megatron" in PRECISIONS["bf16-megatron"].accounting
    m = PRESETS["7b"]
    zero3 = {k: mesh_memory.per_gpu(m, Config(dp=8, zero=3), k) for k in ("bf16", "bf16-fsdp2")}
    assert zero3["bf16"]["params"] * 2 == zero3["bf16-fsdp2"]["params"]        # fp32 shards
    assert zero3["bf16"]["buffers"] == zero3["bf16-fsdp2"]["buffers"]          # bf16 all-gathers
    assert zero3["bf16"]["total"] - zero3["bf16"]["activations"] == pytest.approx(
        zero3["bf16-fsdp2"]["total"] - zero3["bf16-fsdp2"]["activations"], rel=1e-6)


def test_fsdp2_mixed_precision_counted():
    """On 2 processes: the shards stay fp32 (4 + 4 + 8 bytes per shard parameter), the
    all-gathers halve, the reduce-scatter stays fp32: the calculator's "bf16-fsdp2"."""
    r = processes.spawn(fsdp_bf16.wire_and_state, 2, device="cpu")[0]
    p = calculator.PRECISIONS["bf16-fsdp2"]
    assert r["bf16"]["shard_dtype"] == "float32"
    assert r["bf16"]["per_param"] == {"params": p.param, "grads": p.grad, "optimizer": p.optimizer}
    assert r["bf16"]["all_gather"] * 2 == r["fp32"]["all_gather"]
    assert r["bf16"]["reduce_scatter"] == r["fp32"]["reduce_scatter"]


def test_formats_mantissa_bits():
    f = precision.formats()
    assert f == {"fp32": (8, 23), "fp16": (5, 10), "bf16": (8, 7), "tf32": (8, 10)}


def test_grad_scaler_underflow_and_overflow():
    u = precision.underflow()
    assert u["zero_fraction_unscaled"] == 1.0 and u["zero_fraction_scaled"] == 0.0
    assert u["scaled_rel_error"] < 1e-2
    o = precision.overflow()
    assert o["skipped_overflow_step"] and o["next_step_applied"]
    assert o["scale_after_overflow"] == o["init_scale"] / 2
    lost = precision.lost_updates()
    assert lost["moved_pure_bf16"] == 0.0 and lost["moved_fp32_master"] > 0.9


def test_recomputation_keeps_gradients_and_lowers_the_peak():
    torch.manual_seed(0)
    model = TransformerLM(vocab_size=32, dim=32, n_layers=4, n_heads=4, max_len=32)
    assert recompute.same_gradients(model) == 0.0
    r = recompute.measure(model, 4, 32, repeats=1)
    assert r["full"]["peak"] < r["selective"]["peak"] < r["none"]["peak"]
    assert r["full"]["after_forward"] < 0.2 * r["none"]["after_forward"]


def test_selective_drops_the_scores_of_an_unfused_attention():
    """Memory and FLOPs are deterministic: with the math attention the s x s scores dominate and
    selective recomputation drops them for far fewer recomputed FLOPs than full."""
    torch.manual_seed(0)
    model = TransformerLM(vocab_size=32, dim=64, n_layers=3, n_heads=8, max_len=128)
    assert recompute.same_gradients(model, attention="math") == 0.0
    r = recompute.measure(model, 2, 128, repeats=1, attention="math")
    assert r["full"]["peak"] < r["selective"]["peak"] < 0.7 * r["none"]["peak"]
    extra = {m: r[m]["flops"] - r["none"]["flops"] for m in ("full", "selective")}
    assert 0 < extra["selective"] < 0.5 * extra["full"]
    with pytest.raises(ValueError, match="unknown attention"):
        recompute.attention_kernel("fast")
    with pytest.raises(ValueError, match="max_len"):
        recompute.random_tokens(model, 2, 1000)


def test_accumulation_equals_the_big_batch():
    acc = accumulation.same_update(micro_batches=4, steps=1)
    assert acc["max_abs_diff"] < 1e-6
    with pytest.raises(ValueError, match="divisor"):
        accumulation.same_update(micro_batches=3)


def test_live_bytes_counts_new_tensors_only():
    a = torch.ones(1000)
    with LiveBytes() as live:
        b = a * 2                 # 4000 bytes
        a.add_(1)                 # in place: nothing new
        c = b.view(10, 100)       # a view: nothing new
        del b, c
        d = torch.zeros(10)       # 40 bytes, after b died
    assert live.peak == 4000 and live.now == 40
    del d


def test_entry_point_summary(capsys):
    assert report.main(["--dim", "32", "--seq", "16", "--batch", "2", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    last = out.strip().splitlines()[-1]
    assert last.startswith("summary: device=cpu") and "activation_bytes_rel_error=0.00e+00" in last
    assert "megatron_bytes_per_param=18.00" in last
    assert float(last.split("recompute_memory_ratio=")[1]) < 0.6


@pytest.mark.parametrize("flags, says", [
    (["--dim", "30"], "not divisible by --heads"),
    (["--dim", "64", "--heads", "5"], "not divisible by --heads"),
    (["--seq", "0"], "--seq: 0 is not a positive integer"),
    (["--batch", "-2"], "--batch: -2 is not a positive integer"),
    (["--layers", "0"], "--layers"),
    (["--repeats", "0"], "--repeats"),
    (["--attention", "fast"], "invalid choice"),
    (["--snapshot", "timeline.pdf"], "ending in .png"),
    (["--snapshot", "timeline.png"], "needs a GPU"),
])
def test_entry_point_refuses_bad_flags(flags, says, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as err:
        report.parse(flags)
    assert err.value.code == 2 and says in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("module, flags", [
    ("source_code.memory.report", ["--seq", "-1"]),
    ("source_code.memory.mixed_precision", ["--dim", "30"]),
])
def test_bad_flags_end_in_one_line(module, flags, capsys):
    # `python -m module` is run_main(main): the same line and status without a new interpreter
    main = importlib.import_module(module).main
    with pytest.raises(SystemExit) as exit_:
        run_main(lambda: main(flags))
    said = capsys.readouterr()
    assert exit_.value.code == 2 and said.out == ""
    assert len(said.err.strip().splitlines()) == 1 and said.err.startswith("error: "), said.err


def test_mixed_precision_entry_point(capsys):
    assert mixed_precision.main(["--dim", "32", "--layers", "1", "--dp", "4"]) == 0
    out = capsys.readouterr().out
    assert "bf16_step:" in out and "total_per_param=16.00" in out
    assert "megatron_step:" in out and "total_per_param=18.00" in out
    assert "megatron_distributed_optimizer_dp4:" in out
