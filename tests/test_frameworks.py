"""Lightning, Accelerate and DeepSpeed against the plain DDP script (source_code/frameworks/).

The same model, seed and SGD for 2 epochs on 2 processes: Lightning's fully_shard (through
ModelParallelStrategy) and DeepSpeed ZeRO-1 take the plain script's batches, so their weights
must equal its weights up to rounding. Notebook 16 (run by nbval in the same suite) runs
Lightning DDP, Accelerate with and without the plain script's loader and DeepSpeed ZeRO-2 and
ZeRO-3 against the plain script, in one launch (frameworks/side_by_side.py), and asserts the same equalities and accuracies, and springs
Accelerate's world-size trap (exit 2, one error line naming the fix, no traceback from the
script): they are not launched a second time here. Every launch exits 0.
"""
import json

import pytest

from source_code.frameworks import compare

import spawned_main  # tests/: an entry point's main in a rank of processes.spawn

EPOCHS = "2"
WEIGHT_TOL = 1e-5      # rounding only: sums in another order, 46 SGD steps with momentum


def launch(name, path, *args):
    flag = "--checkpoint" if name == "plain DDP" else "--save-weights"
    res = compare.run(name, "--epochs", EPOCHS, flag, str(path), *args)
    assert "terminate called" not in res["output"] and "Traceback" not in res["output"]
    return res


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """The plain DDP script (its flags, seed, training, snapshot) on forked ranks: only the
    frameworks' runs need torchrun's launch here (the plain script's own: notebook 16's and
    tests/test_distributed.py's)."""
    import contextlib
    import io
    from source_code.processes import spawn
    from source_code.training import loop
    path = tmp_path_factory.mktemp("plain") / "plain.pt"
    lines = io.StringIO()
    with contextlib.redirect_stdout(lines):
        assert spawn(spawned_main.ddp_main, 2, "--epochs", EPOCHS, "--checkpoint", str(path), stream=True) == [0, 0]
    out = lines.getvalue()
    return {**loop.parse_summary(out), "name": "plain DDP", "output": out}, path


@pytest.mark.parity
@pytest.mark.parametrize("name, args", [
    ("Lightning", ["--strategy", "model-parallel"]),
    ("DeepSpeed", ["--zero-stage", "1"]),
], ids=["lightning-fully-shard", "zero-1"])
def test_same_steps_same_weights_as_plain_ddp(plain, tmp_path, name, args):
    base, base_path = plain
    res = launch(name, tmp_path / "w.pt", *args)
    assert res["world_size"] == 2 and res["steps"] == compare.steps_of(base) == 46
    diff = compare.weights_diff(base_path, tmp_path / "w.pt")
    print(f"{name} {args}: max |w - w_ddp| = {diff:.2e}, accuracy {res['accuracy']} vs {base['accuracy']}")
    assert diff <= WEIGHT_TOL
    assert abs(res["accuracy"] - base["accuracy"]) <= 1 / 360 + 1e-9  # at most one digit flips


@pytest.mark.parametrize("module, args, message", [
    ("lightning_train", ["--strategy", "fsdp"], "--strategy model-parallel"),
    ("lightning_train", ["--strategy", "deepspeed"], "invalid choice"),
    ("accelerate_train", ["--checkpoint", "x.pt"], "--save-weights"),
    ("accelerate_train", ["--expect-processes", "0"], "positive integer"),
    ("deepspeed_train", ["--batch-size", "63"], "multiple of 2, e.g. 64"),
    ("deepspeed_train", ["--zero-stage", "4"], "invalid choice"),
    ("deepspeed_train", ["--config", "/nonexistent.json"], "not a readable JSON"),
])
def test_bad_flags_fail_in_one_line(module, args, message, monkeypatch):
    import importlib
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("WORKSHOP_DEVICE", "cpu")
    script = importlib.import_module(f"source_code.frameworks.{module}")
    with pytest.raises(SystemExit) as exc:
        script.main(args)
    assert exc.value.code == 2 and message in str(exc.value)


def test_deepspeed_launcher_local_rank_argument_is_accepted(monkeypatch):
    """The deepspeed launcher appends --local_rank=N: parsing goes on to the next check."""
    from source_code.frameworks import deepspeed_train
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit) as exc:
        deepspeed_train.main(["--batch-size", "63", "--local_rank=1"])
    assert "e.g. 64" in str(exc.value)  # not "unrecognized arguments"


def test_deepspeed_config_file_sets_zero_stage():
    from types import SimpleNamespace

    from source_code.frameworks import deepspeed_train
    with open(deepspeed_train.CONFIG) as f:
        raw = json.load(f)
    assert raw["zero_allow_untested_optimizer"] is True and "optimizer" not in raw
    for stage in (1, 2, 3):
        cfg = deepspeed_train.load_config(SimpleNamespace(config=deepspeed_train.CONFIG,
                                                          zero_stage=stage, batch_size=64))
        assert cfg["zero_optimization"]["stage"] == stage and cfg["train_batch_size"] == 64


def test_accelerate_fsdp2_yaml_parses_into_a_plugin():
    from accelerate import FullyShardedDataParallelPlugin
    from accelerate.commands.config.config_args import load_config_from_file

    from source_code.frameworks.accelerate_train import FSDP2_CONFIG
    cfg = load_config_from_file(FSDP2_CONFIG)
    assert cfg.distributed_type.value == "FSDP" and cfg.fsdp_config["fsdp_version"] == 2
    assert cfg.use_cpu is False
    # every key of the file is one the plugin knows (the launcher renames offload_params)
    rename = {"fsdp_version": "fsdp_version", "fsdp_offload_params": "cpu_offload"}
    kwargs = {rename.get(k, k.removeprefix("fsdp_")): v for k, v in cfg.fsdp_config.items()}
    plugin = FullyShardedDataParallelPlugin(**kwargs)
    assert plugin.fsdp_version == 2 and plugin.reshard_after_forward is True


def test_code_lines_skip_comments_blank_lines_and_docstrings():
    src = '"""doc\nstring"""\nimport os  # comment\n\n# only a comment\ndef f():\n    """doc"""\n    return (1,\n            2)\n'
    assert compare.code_lines(src) == 4  # import, def, and the two lines of the return


@pytest.mark.parametrize("env, message", [
    ({"FRAMEWORK": "horovod"}, "use lightning, accelerate or deepspeed"),
    ({"FRAMEWORK": "deepspeed", "LAUNCHER": "srun"}, "which srun does not set: run it with LAUNCHER=torchrun"),
    ({"FRAMEWORK": "accelerate", "LAUNCHER": "srun"}, "LAUNCHER=torchrun (or LAUNCHER=accelerate)"),
    ({"FRAMEWORK": "deepspeed", "LAUNCHER": "accelerate"}, "starts Accelerate's own launcher"),
    ({"FRAMEWORK": "lightning", "LAUNCHER": "mpirun"}, "use torchrun, srun (Lightning) or accelerate"),
])
def test_slurm_script_refuses_unknown_choices_before_anything_starts(root, env, message):
    import os
    import subprocess
    res = subprocess.run(["bash", str(root / "slurm" / "frameworks_train.slurm")], cwd=root,
                         env={**os.environ, **env}, capture_output=True, text=True, timeout=30)
    assert res.returncode == 2 and message in res.stderr and res.stderr.count("\n") == 1, res.stderr


@pytest.mark.parity
def test_one_launch_output_splits_into_one_result_per_run():
    """side_by_side prints ``run: LABEL`` before each run and ``run_seconds`` after it (rank 0);
    the other rank's lines may come anywhere and are kept with the run they fall in."""
    from source_code.frameworks import side_by_side
    out = ("torchrun banner\nrun: plain DDP\nepoch   1/1  loss 2.0  held-out accuracy 0.5  steps 23  1.0s\n"
           "summary: world_size=2 epochs=1 accuracy=0.5000 seconds=1.0 losses=[2.0]\nrun_seconds: 3.50\n"
           "run: Lightning\nsome warning from rank 1\n"
           "summary: world_size=2 epochs=1 accuracy=0.5100 seconds=0.9 steps=23 loss=1.9000\nrun_seconds: 4.25\n"
           "summary: runs=2 seconds=8.0\n")
    runs = compare.split_runs(out)
    assert list(runs) == ["plain DDP", "Lightning"]
    assert runs["plain DDP"]["accuracy"] == 0.5 and runs["plain DDP"]["wall_s"] == 3.5
    assert compare.steps_of(runs["plain DDP"]) == 23 and compare.steps_of(runs["Lightning"]) == 23
    assert "rank 1" in runs["Lightning"]["output"] and runs["Lightning"]["wall_s"] == 4.25
    assert runs["Lightning"]["accuracy"] == 0.51 and "runs=" not in runs["Lightning"]["output"]
    labels = [label for label, _, _ in side_by_side.RUNS]
    assert labels[0] == "plain DDP" and labels[-1] == "plain DDP again" and len(set(labels)) == len(labels)
    assert {m for _, m, _ in side_by_side.RUNS} == set(compare.SCRIPTS.values())   # every script runs
    assert len({side_by_side.weights_path("d", label) for label in labels}) == len(labels)


def test_one_launch_refuses_a_missing_out_dir_and_a_start_without_torchrun(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    from source_code.errors import LaunchError
    from source_code.frameworks import side_by_side
    with pytest.raises(LaunchError, match="no such directory"):
        side_by_side.main(["--out-dir", str(tmp_path / "missing")])
    with pytest.raises(LaunchError, match="start it with torchrun"):   # before importing any framework
        side_by_side.main([])
