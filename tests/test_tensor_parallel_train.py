"""The tensor-parallel training script: flags checked before the group forms, one launch trains."""
import pytest

from source_code.training import loop


@pytest.mark.parametrize("args, message", [
    (["--heads", "3", "--dim", "48"], "do not split over 2 processes"),
    (["--dim", "30"], "divisible by --heads"),
    (["--impl", "megatron"], "invalid choice"),
    (["--samples", "8"], "--batch-size"),
    (["--epochs", "0"], "positive integer"),
])
def test_bad_flags_fail_in_one_line(args, message, monkeypatch):
    from source_code.tensor_parallel import train
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit) as exc:
        train.main(args)
    assert exc.value.code == 2 and message in str(exc.value)


@pytest.mark.parametrize("env", [
    {"RANK": "0", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"},                  # torchrun, 2 nodes
    {"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "8", "SLURM_NODEID": "0",     # srun, 2 nodes
     "SLURM_STEP_TASKS_PER_NODE": "4(x2)"},
], ids=["torchrun", "srun"])
def test_a_tp_group_across_nodes_is_refused_in_one_line(env, monkeypatch):
    from source_code.tensor_parallel import train
    for key in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SystemExit) as exc:
        train.main(["--heads", "8"])
    assert exc.value.code == 2
    assert str(exc.value).startswith("error: tensor parallelism over all 8 processes would span "
                                     "nodes (4 processes per node)")
    assert "source_code.mesh.train_2d" in str(exc.value)


def test_one_node_guard_is_shared_with_the_2d_script():
    from source_code.mesh import train_2d
    from source_code.tensor_parallel import placement, train
    assert train.check_tp_in_node is train_2d.check_tp_in_node is placement.check_tp_in_node
    assert placement.check_tp_in_node(4, 8, {"LOCAL_WORLD_SIZE": "4"}) == 4
    assert placement.check_tp_in_node(2, 2, {}) == 2


@pytest.mark.parity
def test_one_launch_trains_and_exits_cleanly(torchrun):
    res = torchrun("source_code.tensor_parallel.train", "--impl", "own", "--epochs", "1",
                   "--max-steps", "24", "--eval-samples", "64", nproc=2)
    assert "terminate called" not in res.stdout
    assert "Warning" not in res.stdout          # the loss is summed detached: no autograd warning
    summary = loop.parse_summary(res.stdout)
    assert summary["world_size"] == 2 and summary["accuracy"] > 0.3
    assert sum(ln.startswith("epoch") for ln in res.stdout.splitlines()) == 1   # rank 0 prints alone
