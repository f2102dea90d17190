"""The tensor-parallel training script: flags checked before the group forms."""
import pytest


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


# One launch of the entry point training 24 steps: notebook 11's section 10 runs it for both
# implementations and asserts each (world size 2, accuracy above 0.3, no autograd warning, rank 0
# alone printing its epoch lines, no "terminate called": an abort at exit that the exit status
# does not always show).
