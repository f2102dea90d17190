"""Sharding, in one process: the planner's formulas, ZeRO's chunk bookkeeping, the exercise check."""
import pytest
import torch

from source_code.planner import memory as planner
from source_code.sharding import comm, workload
from source_code.sharding.exercises import check_predict_state_bytes
from source_code.solutions import nb08_sharding


def test_planner_zero_table():
    p = 1_000_000
    ddp, z1, z2, fsdp = (planner.state_bytes(p, 4, s, step_bytes=0) for s in planner.STRATEGIES)
    assert ddp["total"] == 16 * p                     # 4 + 4 + 8 bytes per parameter
    assert z1["optimizer"] == 2 * p and z1["grads"] == 4 * p
    assert z2["grads"] == p and z2["params"] == 4 * p
    assert fsdp["total"] == 4 * p                     # everything / 4
    assert planner.communication_bytes(p, 4, "ddp") == pytest.approx(2 * 3 / 4 * 4 * p)
    assert planner.communication_bytes(p, 4, "fsdp") == pytest.approx(3 * 3 / 4 * 4 * p)


def test_planner_activation_formula_matches_saved_tensors():
    cfg = workload.model_config(dim=32, n_layers=2, n_heads=4)
    model = workload.build_model(cfg, 0)
    x, y = workload.global_batch(workload.sort_task(64), 0, 8)
    from source_code.sharding.memory_report import _activation_bytes
    counted = _activation_bytes(model, x, y)
    predicted = planner.activation_bytes(8, x.shape[1], 32, 2, 4, cfg["vocab_size"])
    assert abs(predicted - counted) <= 0.1 * counted


@pytest.mark.parametrize("numel,world", [(10, 3), (7, 4), (8, 2), (1, 4)])
def test_chunks_cover_every_element_once(numel, world):
    ranges = [comm.owned_range(numel, world, r) for r in range(world)]
    covered = [i for lo, hi in ranges for i in range(lo, hi)]
    assert covered == list(range(numel))
    assert comm.padded(torch.ones(numel), world).numel() == comm.chunk_size(numel, world) * world


def test_weights_do_not_depend_on_how_the_model_is_built():
    cfg = workload.model_config(dim=32, n_layers=1)
    a, b = workload.build_model(cfg, 3), workload.build_model(cfg, 3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not torch.equal(next(workload.build_model(cfg, 4).parameters()), next(a.parameters()))


def test_global_batch_is_world_size_free():
    ds = workload.sort_task(64)
    batch = workload.global_batch(ds, 3, 16)
    parts = [workload.rank_slice(batch, r, 4)[0] for r in range(4)]
    assert torch.equal(torch.cat(parts), batch[0])


ROW = {"world_size": 4, "strategy": "fsdp", "n_params": 107_776, "params": 107_776,
       "grads": 107_776, "optimizer": 2 * 107_776 + 4 * 30}


def test_exercise_solution_passes():
    assert check_predict_state_bytes(nb08_sharding.predict_state_bytes, [ROW]).startswith("correct")


def _adam_one_state(n, world, strategy):
    b = nb08_sharding.predict_state_bytes(n, world, strategy)
    return {**b, "optimizer": b["optimizer"] / 2}     # forgets exp_avg_sq


def _zero2_shards_params(n, world, strategy):
    b = nb08_sharding.predict_state_bytes(n, world, strategy)
    return {**b, "params": b["params"] / world if strategy == "zero2" else b["params"]}


def _fsdp_keeps_full_grads(n, world, strategy):
    b = nb08_sharding.predict_state_bytes(n, world, strategy)
    return {**b, "grads": 4 * n if strategy == "fsdp" else b["grads"]}


@pytest.mark.parametrize("wrong,hint", [(_adam_one_state, "2 numbers per parameter"),
                                        (_zero2_shards_params, "only FSDP"),
                                        (_fsdp_keeps_full_grads, "ZeRO-2 and FSDP keep 1/N")])
def test_exercise_wrong_answers_fail(wrong, hint):
    with pytest.raises(AssertionError, match=hint):
        check_predict_state_bytes(wrong)


def test_exercise_unfinished_is_reported():
    def todo(n, world, strategy):
        raise NotImplementedError
    with pytest.raises(NotImplementedError, match="not done yet"):
        check_predict_state_bytes(todo)
