"""Adam's moments in bf16 and 8 bits, pure bf16's small updates kept, activation offloading
(source_code/memory/optimizer_precision.py, compensated.py, offload.py; notebook 08).

What the notebook does not run: the 8-bit quantiser's levels and round trip on values it never
shows, the hand-written Adam against torch.optim.Adam, Kahan and stochastic rounding on other
step sizes and on negative values, offloading on another model size, the entry points' summary
lines and their refusals of bad flags (exit status 2, one line).
"""
import subprocess
import sys

import pytest
import torch

from source_code import workload
from source_code.memory import compensated, offload, optimizer_precision as op, report


@pytest.mark.parametrize("signed", [True, False])
def test_dynamic_levels(signed):
    levels = op.dynamic_map(signed)
    assert levels.numel() == 256 and torch.equal(levels, levels.sort().values)
    assert levels.unique().numel() == 256
    assert levels.max() == 1 and levels.min() == (-levels[(levels > 0) & (levels < 1)].max() if signed else 0)
    small = levels[(levels > 0) & (levels < 1e-3)]
    assert small.numel() > 0, "dynamic levels keep values below 1e-3 of the absmax"


def test_blockwise_round_trip_is_the_nearest_level():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5000, generator=g) * torch.logspace(-4, 0, 5000)      # magnitudes over 4 decades
    q = op.Blockwise8bit(x, signed=True, block=512)
    q.store(x)
    back = q.load()
    assert back.shape == x.shape and q.codes.dtype == torch.uint8 and q.absmax.numel() == 10
    blocks = torch.nn.functional.pad(x, (0, 120)).view(-1, 512)
    absmax = blocks.abs().amax(1)
    assert torch.equal(q.absmax, absmax)
    scaled = (x / absmax.repeat_interleave(512)[:5000]).unsqueeze(1)
    nearest = q.levels[(scaled - q.levels).abs().argmin(1)] * absmax.repeat_interleave(512)[:5000]
    assert torch.allclose(back, nearest, rtol=1e-6, atol=0)
    biggest = (blocks.abs().argmax(1) + torch.arange(10) * 512)[:-1]
    positive = biggest[x[biggest] > 0]                                       # level 1 exists, -1 does not
    assert positive.numel() > 0 and torch.allclose(back[positive], x[positive])   # the absmax comes back
    q.store(torch.zeros(5000))
    assert torch.equal(q.load(), torch.zeros(5000))


def test_fp32_moments_are_torch_adam():
    cfg = workload.model_config(dim=32, n_layers=1, n_heads=2)
    ours, ref = workload.build_model(cfg, 1), workload.build_model(cfg, 1)
    a, b = op.Adam(ours.parameters(), lr=1e-2), torch.optim.Adam(ref.parameters(), lr=1e-2)
    task = workload.sort_task(64)
    for step in range(4):
        x, y = workload.global_batch(task, step, 8)
        for model, opt in ((ours, a), (ref, b)):
            workload.loss_fn(model, x, y).backward()
            opt.step()
            opt.zero_grad()
    diff = max((p - q).abs().max().item() for p, q in zip(ours.parameters(), ref.parameters()))
    assert diff < 1e-6, diff


def test_moment_bytes_and_unknown_format():
    cfg = workload.model_config(dim=32, n_layers=1, n_heads=2)
    assert op.state_bytes_per_param("fp32", cfg) == 8 and op.state_bytes_per_param("bf16", cfg) == 4
    assert 2 < op.state_bytes_per_param("8bit", cfg, block=64) < 2.2
    with pytest.raises(ValueError, match="choose one of fp32, bf16, 8bit"):
        op.Adam([torch.zeros(3, requires_grad=True)], fmt="int4")


@pytest.mark.parametrize("lr, steps", [(3e-4, 50), (-2e-4, 80)])
def test_kahan_follows_the_master_copy(lr, steps):
    r = compensated.small_updates(lr=lr, steps=steps, n=2048, seed=5)
    assert r["bf16"]["moved"] == 0 or abs(lr) > 2e-3
    assert torch.equal(r["kahan"]["drift"], r["fp32-master"]["drift"])
    sr = r["stochastic"]["drift"]
    assert abs(sr.mean().item() - lr * steps) < 4 * sr.std().item() / sr.numel() ** 0.5
    assert (r["bf16"]["bytes_per_param"], r["kahan"]["bytes_per_param"], r["stochastic"]["bytes_per_param"],
            r["fp32-master"]["bytes_per_param"]) == (2, 4, 2, 6)


def test_stochastic_rounding_is_unbiased_and_exact_on_bf16_values():
    g = torch.Generator().manual_seed(0)
    exact = torch.randn(1000, generator=g).to(torch.bfloat16)
    assert torch.equal(compensated.stochastic_round(exact.float(), g), exact)
    for value in (-1.0001, 3.3337e-3):
        draws = compensated.stochastic_round(torch.full((200_000,), value), g).float()
        spacing = draws.max() - draws.min()
        assert spacing > 0 and abs(draws.mean().item() - value) < 5 * spacing / 200_000 ** 0.5, value


def test_offload_on_another_model():
    cfg = workload.model_config(dim=32, n_layers=3, n_heads=2)
    r = offload.measure(cfg, batch=4, repeats=1)
    assert r["max_abs_grad_diff"] == 0 and r["copied"] == 0 and not r["pin_memory"]
    assert r["packed"] == r["activation_bytes"] + r["packed_params"] and r["packed_params"] > 0


def test_copy_over_compute_falls_with_the_width():
    ratios = [offload.copy_over_compute(h, h // 128, 2048) for h in (512, 2048, 8192)]
    assert ratios[0] > ratios[1] > ratios[2]
    h = offload.hides_from(seq=2048, host_gbps=100.0)
    assert h < offload.hides_from(seq=2048) and offload.copy_over_compute(h, h // 128, 2048, host_gbps=100.0) <= 1


def test_summary_lines(capsys):
    assert op.main(["--steps", "3"]) == 0
    assert compensated.main(["--steps", "20"]) == 0
    assert offload.main(["--dim", "32", "--heads", "2", "--repeats", "1"]) == 0
    lines = [l for l in capsys.readouterr().out.splitlines() if l.startswith("summary:")]
    assert len(lines) == 3 and "8bit_held_out_loss=" in lines[0] and "kahan_mean_drift=" in lines[1]
    assert "max_abs_grad_diff=0.0e+00" in lines[2] and "copied_bytes=0" in lines[2]


def test_report_adds_its_fields(capsys):
    assert report.main(["--dim", "32", "--seq", "16", "--batch", "2", "--repeats", "1", "--layers", "1"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert "megatron_bytes_per_param=18.00" in last and "kahan_drift_max_abs_diff=0.0e+00" in last
    assert "offload_max_abs_grad_diff=0.0e+00" in last
    assert 2 < float(last.split("adam_8bit_moment_bytes_per_param=")[1].split()[0]) < 2.01
    assert 0.8 < float(last.split("stochastic_drift_ratio=")[1].split()[0]) < 1.2


@pytest.mark.parametrize("main, flags, says", [
    (op.main, ["--lr", "5"], "--lr 5"),
    (op.main, ["--steps", "0"], "--steps"),
    (compensated.main, ["--lr", "0"], "--lr 0"),
    (offload.main, ["--dim", "30"], "not divisible by --heads"),
    (offload.main, ["--device", "gpu"], "invalid choice"),
])
def test_bad_flags_are_refused_before_work(main, flags, says, capsys):
    with pytest.raises(SystemExit) as err:
        main(flags)
    message = str(err.value) + capsys.readouterr().err
    assert err.value.code == 2 and says in message, message


def test_a_bad_flag_ends_in_one_line():
    r = subprocess.run([sys.executable, "-m", "source_code.memory.offload", "--batch", "0"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("error: "), r.stderr


def test_allocator_skips_in_one_line_without_a_gpu(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the gpu-smoke check runs the allocator")
    from source_code.memory import allocator
    assert allocator.compare() is None
    assert allocator.main([]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("allocator: skipped (no GPU here")
