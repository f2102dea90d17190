"""The 2D training script: flags checked against the launch before any work, a real 2 x 2 run."""
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

from source_code.distributed import LaunchError, run_main
from source_code.mesh import train_2d
from source_code.processes import spawn
from source_code.training.loop import parse_summary

sys.path.insert(0, str(Path(__file__).parent))
import spawned_main  # noqa: E402  tests/: an entry point's main in a rank of processes.spawn


def env(world, local=None):
    e = {"RANK": "0", "WORLD_SIZE": str(world), "MASTER_ADDR": "x", "MASTER_PORT": "1"}
    if local:
        e["LOCAL_WORLD_SIZE"] = str(local)
    return e


def test_check_gives_the_mesh_shape():
    assert train_2d.check(train_2d.parse_args(["--tp", "2"]), env(4)) == (2, 2)
    assert train_2d.check(train_2d.parse_args(["--tp", "4"]), env(8, local=4)) == (2, 4)
    assert train_2d.check(train_2d.parse_args(["--tp", "1"]), {}) == (1, 1)


@pytest.mark.parametrize("argv, world, local, message", [
    (["--tp", "3"], 4, None, "world size 4 is not divisible by --tp 3; use a --tp that divides 4"),
    (["--tp", "4"], 8, 2, "--tp 4 would span nodes (2 processes per node)"),
    (["--tp", "8", "--heads", "4"], 8, None, "4 heads do not divide among 8 tp ranks"),
    (["--batch-size", "30"], 8, None, "--batch-size 30 does not divide among 4 dp groups"),
    (["--dim", "66"], 4, None, "--dim 66 must be a multiple of --heads 4"),
])
def test_bad_launches_fail_in_one_line(argv, world, local, message):
    with pytest.raises(LaunchError, match="^error: ") as err:
        train_2d.check(train_2d.parse_args(argv), env(world, local))
    assert message in str(err.value)


def test_bad_flag_exits_2_with_one_line_before_any_process_group(monkeypatch, capsys):
    for key, value in env(4).items():  # rank 0 of a launch of 4
        monkeypatch.setenv(key, value)
    with pytest.raises(SystemExit) as exit_:  # run_main(main): what `python -m` runs
        run_main(lambda: train_2d.main(["--tp", "3"]))
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and not dist.is_initialized(), err
    assert err.startswith("error: world size 4 is not divisible by --tp 3")


@pytest.mark.parity
def test_2d_training_on_4_processes_learns():
    """train_2d's main on 4 forked ranks (its torchrun launches: notebook 12's Slurm lines)."""
    ranks = spawn(spawned_main.session_main, 4, "source_code.mesh.train_2d", "--tp", 2, "--steps", 10,
                  stream=False)
    assert [code for code, _ in ranks] == [0] * 4
    out = "".join(printed for _, printed in ranks)
    assert "tp group [0, 1] on" in out and "tp group [2, 3] on" in out
    assert out.count("summary:") == 1 and out.count("step   10/10") == 1   # rank 0 prints
    s = parse_summary(out)
    assert (s["world_size"], s["dp"], s["tp"], s["steps"]) == (4, 2, 2, 10)
    assert s["loss"] < 2.5    # from ln(17) = 2.83 at the start (about 2.1 after 10 steps on the CPU)
