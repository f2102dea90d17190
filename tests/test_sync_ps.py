"""The parameter server trains the digits CNN to the same weights as DDP; the collectives demo."""
import sys
from pathlib import Path

import pytest

from source_code.processes import spawn
from source_code.sync import collectives
from source_code.sync.harness import ps_vs_ddp

sys.path.insert(0, str(Path(__file__).parent))
import spawned_main  # noqa: E402  tests/: an entry point's main in a rank of processes.spawn


@pytest.mark.parity
def test_parameter_server_matches_ddp():
    out = spawn(ps_vs_ddp, 3, 12)  # server + 2 workers, 12 steps of plain SGD
    res = out[0]
    assert res["world_size"] == 3
    assert res["max_weight_change"] > 1e-3       # training moved the weights ...
    assert res["max_abs_diff"] < 1e-5            # ... to the same place as DDP
    assert res["pull_diff"] == 0.0               # and every worker holds the server's weights
    assert len(res["losses"]) == 12 and res["losses"][-1] < res["losses"][0]


def test_collectives_outputs_on_four_processes():
    world = 4
    results = spawn(collectives.run_collectives, world)
    for rank, res in enumerate(results):
        for name in collectives.COLLECTIVES:
            assert res[name][1] == collectives.expected(name, rank, world), (name, rank, res[name])
        assert res["rs_plus_ag_diff"] < 1e-12  # all-reduce = reduce-scatter + all-gather
    assert "(undefined" in collectives.table(results, "reduce")


def test_parameter_server_script_on_three_ranks():
    """The script's main on 3 forked ranks (under torchrun: notebook 02's Slurm line)."""
    ranks = spawn(spawned_main.session_main, 3, "source_code.sync.parameter_server", "--steps", 2, stream=False)
    printed = "".join(out for _, out in ranks)
    summary = [ln for ln in printed.splitlines() if ln.startswith("summary:")]
    assert len(summary) == 1 and "workers=2" in summary[0] and "steps=2" in summary[0], printed
