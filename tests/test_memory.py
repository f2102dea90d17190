"""Memory, precision and recomputation (source_code/memory/, notebook 08): single-process checks.

The counted activation bytes equal the formula's term by term; the calculator and the planner
give the same bytes; the precisions' bytes per parameter; GradScaler's underflow and overflow;
recomputation keeps the gradients and lowers the peak; the entry point's summary line.
"""
import pytest
import torch

from source_code.memory import calculator, formula, precision, recompute, report
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
    assert per["fp16-scaler"]["params"] == 4 and 16 < per["fp16-scaler"]["total"] < 16.01  # + the scale
    assert per["bf16-pure"]["total"] == 8


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
    assert float(last.split("recompute_memory_ratio=")[1]) < 0.6


def test_entry_point_refuses_bad_flags():
    with pytest.raises(SystemExit) as err:
        report.main(["--dim", "30"])
    assert err.value.code == 2
