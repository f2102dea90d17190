"""Device meshes on real processes: the 2 x 2 mesh and its shards, 2D and 3D training equal to one process."""
import time

import pytest

from source_code.mesh import layout
from source_code.processes import spawn

pytestmark = pytest.mark.parity


def test_mesh_rows_are_tp_groups_and_owner_maps_tile_each_weight():
    info = spawn(layout.describe, 4, device="cpu")
    d = info[0]
    assert d["mesh"] == [[0, 1], [2, 3]] and d["dim_names"] == ["dp", "tp"]
    assert d["tp_groups"] == [[0, 1], [2, 3]] and d["dp_groups"] == [[0, 2], [1, 3]]
    assert [r["my_coordinate"] for r in info] == [[0, 0], [0, 1], [1, 0], [1, 1]]
    assert [r["tp_group_of_rank"] for r in info] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    wq, wo = d["params"]["layers.0.attn.wq.weight"], d["params"]["layers.0.attn.wo.weight"]
    # FSDP2 on dp shards each TP shard again: strided along dim 0 for a Colwise weight
    assert wq["placements"][0].startswith("_StridedShard(dim=0") and wq["placements"][1] == "Shard(dim=0)"
    assert wo["placements"] == ["Shard(dim=0)", "Shard(dim=1)"]
    for entry in (wq, wo):                # every element held by exactly one of the 4 ranks, a quarter each
        counts = [(entry["owners"] == r).sum().item() for r in range(4)]
        assert counts == [entry["owners"].size // 4] * 4
        assert entry["local_shapes"] == [entry["local_shapes"][0]] * 4
    # tp rank 1 holds rows 32:48 of wq: the tp split is the outer one, dp cuts inside it
    assert layout.slices_of(wq["owners"], 1) == "rows 32:48, cols 0:64"
    assert layout.slices_of(wq["owners"], 2) == "rows 16:32, cols 0:64"
    assert layout.slices_of(wo["owners"], 1) == "rows 0:32, cols 32:64"


@pytest.mark.parametrize("dp, tp", [(2, 2)])
def test_2d_fsdp_x_tp_equals_one_process(dp, tp):
    from source_code.mesh.parity import run_2d
    results = spawn(run_2d, dp * tp, dp, tp, 3, device="cpu")
    r = results[0]
    print(f"2D dp={dp} tp={tp}: loss_diff={r['loss_diff']:.3g} max_abs_diff={r['max_abs_diff']:.3g}")
    assert max(x["max_abs_diff"] for x in results) <= 1e-6
    assert r["loss_diff"] <= 1e-5
    assert r["placements"]["layers.0.mlp.down.weight"] == "(Shard(dim=0), Shard(dim=1))"


def test_3d_pipeline_x_data_x_tensor_equals_one_process():
    from source_code.mesh.pipeline3d import run_3d
    start = time.perf_counter()
    results = spawn(run_3d, 8, 2, 2, 2, 2, device="cpu")
    seconds = time.perf_counter() - start
    worst = max(r["max_abs_diff"] for r in results)
    loss = max(r["loss_diff"] for r in results)
    print(f"3D pp2 x dp2 x tp2, 8 processes: max_abs_diff={worst:.3g} loss_diff={loss:.3g} "
          f"in {seconds:.1f} s")
    assert sorted(r["coords"] for r in results) == [(p, d, t) for p in range(2) for d in range(2)
                                                    for t in range(2)]
    assert worst <= 1e-6 and loss <= 1e-5
