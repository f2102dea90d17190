"""The planner's arithmetic, search and command line (no processes)."""
import pytest

from source_code.planner import communication, mesh_memory, plan, search
from source_code.planner.spec import PRESETS, Cluster, Config, model_from


def test_presets_count_the_transformerlm_parameters():
    from source_code.models import TransformerLM, count_parameters
    assert PRESETS["workshop"].params() == count_parameters(TransformerLM())
    assert 6.5e9 < PRESETS["7b"].params() < 7e9 and 6.4e10 < PRESETS["70b"].params() < 7.1e10


def test_model_from_params_and_dimensions():
    m = model_from(params=7e9, layers=32, hidden=4096, seq=4096)
    assert abs(m.params() - 7e9) / 7e9 < 0.001
    with pytest.raises(ValueError, match="fewer than"):
        model_from(params=1e9, layers=32, hidden=4096)
    with pytest.raises(ValueError, match="unknown model"):
        model_from("13b")


def test_memory_zero_stages_shard_what_they_promise():
    m = PRESETS["7b"]
    ddp, z1, z2, z3 = (mesh_memory.per_gpu(m, Config(dp=8, zero=z), "bf16") for z in range(4))
    p = m.params()
    assert ddp["params"] == 2 * p and ddp["grads"] == 2 * p and ddp["optimizer"] == 12 * p
    assert z1["optimizer"] == pytest.approx(12 * p / 8, rel=1e-6) and z1["grads"] == 2 * p
    assert z2["grads"] == pytest.approx(2 * p / 8, rel=1e-6) and z2["params"] == 2 * p
    assert z3["params"] == pytest.approx(2 * p / 8, rel=1e-6) and z3["buffers"] > 0


def test_tp_divides_blocks_and_checkpointing_cuts_activations():
    m = PRESETS["7b"]
    one, tp8 = (mesh_memory.per_gpu(m, Config(dp=1, tp=t), "bf16") for t in (1, 8))
    blocks = m.layers * m.block_tp_sharded()
    assert one["params"] - tp8["params"] == pytest.approx(2 * blocks * 7 / 8, rel=1e-6)
    ckpt = mesh_memory.per_gpu(m, Config(dp=1, checkpointing=True), "bf16")
    assert ckpt["activations"] < one["activations"] / 8


def test_pipeline_first_stage_holds_pp_microbatches():
    m = PRESETS["7b"]
    cfg = Config(dp=1, pp=4, global_batch=16)
    assert [mesh_memory.in_flight(cfg, s) for s in range(4)] == [4, 3, 2, 1]
    assert mesh_memory.stage_layers(10, 4) == [3, 3, 2, 2]
    assert mesh_memory.per_gpu(m, cfg, "bf16")["stage"] == 0


def test_communication_kinds_and_links():
    m = PRESETS["7b"]
    rows = communication.per_step(m, Config(dp=4, tp=8, pp=2, zero=3, global_batch=64), 8, "bf16")
    by = {(r["dim"], r["kind"]): r for r in rows}
    assert by[("tp", "all_reduce")]["where"] == "intra"        # tp = a whole node
    assert by[("dp", "all_gather")]["where"] == "inter" and by[("pp", "send_recv")]["where"] == "inter"
    ddp = communication.per_step(m, Config(dp=8), 8, "bf16")
    assert len(ddp) == 1 and ddp[0]["wire"] == pytest.approx(2 * 7 / 8 * 2 * m.params())
    assert ddp[0]["where"] == "intra"
    assert communication.where(Config(dp=2, tp=4), "dp", 4) == "inter"


def test_zero_stages_charge_the_traffic_of_the_gradients_they_keep():
    """ZeRO-1 keeps full gradients and reduce-scatters once per step; ZeRO-2 keeps 1/dp and
    reduce-scatters every micro-batch (the review's case: 8 micro-batches per rank)."""
    m = model_from(params=7e9, layers=32, hidden=4096, seq=4096)
    cfg = {z: Config(dp=64, zero=z, global_batch=512) for z in (1, 2)}
    assert cfg[1].micro_batches == 8
    rs = {z: {(r["kind"]): r for r in communication.per_step(m, c, 8, "bf16")}["reduce_scatter"]
          for z, c in cfg.items()}
    mem = {z: mesh_memory.per_gpu(m, c, "bf16")["grads"] for z, c in cfg.items()}
    assert rs[1]["calls"] == 1 and rs[2]["calls"] == 8
    assert rs[2]["payload"] == pytest.approx(8 * rs[1]["payload"])
    assert mem[1] == pytest.approx(64 * mem[2], rel=1e-6)
    one = {z: communication.per_step(m, Config(dp=64, zero=z, global_batch=64), 8, "bf16")
           for z in (1, 2)}
    assert one[1] == one[2]                  # one micro-batch: the two variants are the same


def test_pipeline_with_zero2_or_3_carries_deepspeeds_refusal():
    cluster = plan.cluster_of("a100", 2)
    notes = {z: search.evaluate(PRESETS["7b"], Config(dp=4, pp=2, zero=z, global_batch=512),
                                cluster).notes for z in range(4)}
    assert notes[0] == notes[1] == [] and "refuses ZeRO-2/3" in notes[2][0]
    assert "128 times" in notes[2][0] and "all-gather" in notes[3][0] and "all-gather" not in notes[2][0]
    assert search.evaluate(PRESETS["7b"], Config(dp=8, zero=2, global_batch=512), cluster).notes == []


def test_search_reasons_and_ranking():
    cluster = plan.cluster_of("a100", 2)
    fit, fail = search.search(PRESETS["7b"], cluster, 1, 512)
    assert fit and all(a.step_s <= b.step_s + 1e-3 for a, b in zip(fit, fit[1:]))
    reasons = {p.cfg.label(): p.reason for p in fail}
    assert "spans nodes" in reasons["dp1(ddp) x tp8 x pp1, mb1"]
    assert reasons["dp8(ddp) x tp1 x pp1, mb1"].startswith("needs 124.8 GB per GPU > 36.0 GB usable")
    bad = search.evaluate(PRESETS["7b"], Config(dp=1, tp=1, pp=8, global_batch=4), cluster)
    assert "micro-batch" in bad.reason


def test_the_four_questions_have_answers_from_the_numbers():
    for name, site, nodes in plan.QUESTIONS:
        info = plan.explain(PRESETS[name], plan.cluster_of(site, nodes))
        assert info["best"] is not None and info["best"].fits
        assert any(line.strip().startswith("pure DDP") for line in info["lines"])
        assert info["best"].memory["total"] <= 0.9 * plan.CLUSTERS[site]["gpu_mem_gb"] * 1e9
    seventy = plan.explain(PRESETS["70b"], plan.cluster_of("lumi", 16))
    assert seventy["best"].cfg.tp * seventy["best"].cfg.pp > 1    # cutting the model is fastest
    fsdp = next(line for line in seventy["lines"] if line.strip().startswith("pure FSDP"))
    assert "> 57.6 GB usable" in fsdp and "with checkpointing fits" in fsdp   # yet FSDP + ckpt fits
    assumed = next(line for line in seventy["lines"] if line.strip().startswith("assumes:"))
    assert "75 TFLOP/s" in assumed and "12.5 GB/s between nodes" in assumed
    assert any("ZeRO-2: 1/dp of the gradients kept, a reduce-scatter after every micro-batch" in line
               for line in seventy["lines"])


def test_cli(capsys):
    assert plan.main(["--params", "7e9", "--layers", "32", "--hidden", "4096", "--seq", "4096",
                      "--gpus", "64", "--gpu-mem-gb", "64", "--gpus-per-node", "8"]) == 0
    out = capsys.readouterr().out
    assert "best: " in out and "do not fit or cannot be built" in out and "comm s" in out
    assert plan.main(["--model", "7b", "--cluster", "a100", "--nodes", "2", "--tp", "8"]) == 1
    assert "spans nodes" in capsys.readouterr().out
    assert plan.main(["--model", "7b", "--cluster", "a100", "--nodes", "2", "--tp", "1", "--pp", "2",
                      "--zero", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("dp4(zero2) x tp1 x pp2, mb1: fits") and "GB with" in out and "inter-node" in out
    assert "assumes ZeRO-2: 1/dp of the gradients kept" in out and "note: DeepSpeed's pipeline" in out
    assert plan.main(["--params", "7e9", "--layers", "32", "--hidden", "4096", "--seq", "4096", "--gpus",
                      "64", "--gpu-mem-gb", "80", "--gpus-per-node", "8", "--tp", "1", "--zero", "1"]) == 0
    out = capsys.readouterr().out
    assert "one reduce-scatter per step; 8 micro-batch(es)" in out and "note:" not in out


@pytest.mark.parametrize("argv, message", [
    (["--model", "7b", "--gpus", "12", "--gpus-per-node", "8", "--gpu-mem-gb", "64"], "whole number"),
    (["--model", "7b"], "give --cluster NAME"),
    (["--layers", "32"], "give a model"),
    (["--model", "7b", "--cluster", "lumi", "--nodes", "0"], "positive integer"),
])
def test_cli_bad_input(argv, message):
    from source_code.distributed import LaunchError
    with pytest.raises(LaunchError, match=message):
        plan.main(argv)
