"""Sharding on real processes: ZeRO-1/2, ZeroRedundancyOptimizer, FSDP2 vs one process; the memory ratio."""
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import spawned_main  # noqa: E402  tests/: an entry point's main in a rank of processes.spawn

pytestmark = pytest.mark.parity


@pytest.mark.parametrize("nproc", [4])  # 2 processes under torchrun: notebook 09 runs it and asserts the same
def test_parity_with_one_process(nproc):
    from source_code.processes import spawn
    ranks = spawn(spawned_main.session_main, nproc, "source_code.sharding.parity", "--steps", 3, stream=False)
    assert [code for code, _ in ranks] == [0] * nproc
    out = ranks[0][1]
    diffs = dict(re.findall(r"parity: impl=(\w+) world_size=\d+ device=\S+ steps=3 max_abs_diff=(\S+)", out))
    assert set(diffs) == {"zero1", "zero2", "torch_zero", "fsdp"}, out[-1500:]
    assert all(float(d) <= 1e-6 for d in diffs.values()), diffs


def test_memory_ratio_and_predictions_at_4_ranks():
    from source_code.processes import spawn
    from source_code import workload
    from source_code.sharding import memory_report
    cfg = workload.model_config(dim=64, n_layers=2)
    rows = spawn(memory_report.measure_rank, 4, cfg, 8, ("ddp", "zero2", "fsdp"))[0]
    assert memory_report.ratio(rows) <= 0.275
    assert memory_report.worst_prediction_error(rows) <= 0.10
    by = {r["strategy"]: r for r in rows}
    assert by["fsdp"]["wire_bytes"] == pytest.approx(by["fsdp"]["pred_wire_bytes"], rel=0.1)
    assert by["ddp"]["wire_bytes"] == pytest.approx(by["ddp"]["pred_wire_bytes"], rel=0.1)
