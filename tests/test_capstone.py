"""The capstone's entry point: flags refused in one line before any work, and its summary line.

    .venv/bin/python -m pytest tests/test_capstone.py -q

The notebook (nbval) runs the whole matrix; here a subset of configurations keeps the
processes short, with the uneven-token case that every run starts with.
"""
from __future__ import annotations

import re

import pytest
import torch

from source_code.capstone import matrix
from source_code.errors import LaunchError


@pytest.mark.parametrize("argv, words", [
    (["--batch-size", "12"], "multiple of 8"),
    (["--steps", "0"], "positive integer"),
    (["--configs", "DDP", "ZeRO-4"], "unknown configuration 'ZeRO-4'"),
    (["--lr", "-1"], "positive number"),
])
def test_bad_flags_refused_in_one_line(argv, words):
    with pytest.raises(LaunchError) as err:
        matrix.main(argv)
    assert words in err.value.message and "\n" not in err.value.message, err.value.message


def test_summary_line_of_a_subset(capsys):
    """The entry point's main in this process (its ranks forked from the fork server this process
    already has, not from a new interpreter's own)."""
    assert matrix.main(["--steps", "2", "--steps-fp64", "4", "--configs", "DDP", "TP (own)", "PP x DP"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("summary: "), last
    s = dict(kv.split("=", 1) for kv in last.split()[1:])
    assert (int(s["parallel_configs"]), int(s["controls"]), int(s["three_d_configs"])) == (3, 0, 0), last
    assert (int(s["steps"]), int(s["steps_fp64"])) == (2, 4), last
    assert float(s["max_loss_diff"]) <= 1e-5, f"a configuration's loss left the one-process curve: {last}"
    assert float(s["max_loss_diff_fp64"]) <= 1e-12, f"fp64 shows a difference beyond rounding: {last}"
    assert float(s["max_loss_diff_fp64"]) <= max(float(s["max_loss_diff"]), 2.4e-7) / 1e6, last   # one fp32 unit at least
    assert float(s["uneven_tokens_grad_diff_fixed"]) <= 1e-6, f"the fixed normalisation is not exact: {last}"
    assert float(s["uneven_tokens_grad_diff_naive"]) >= 1e-3, f"the per-piece mean did not visibly fail: {last}"


@pytest.mark.parametrize("sizes, words", [
    (dict(world=4, dp=3), "not the world size 4"),
    (dict(world=3, tp=3), "heads do not divide among tp=3"),
    (dict(world=3, pp=3), "layers do not divide into pp=3"),
    (dict(world=3, ep=3), "experts do not divide among ep=3"),
    (dict(world=3, cp=3), "2 x cp = 6"),
    (dict(world=4, pp=2, cp=2), "pp x cp"),
    (dict(world=4, ep=2, tp=2), "expert parallelism combines with data parallelism only"),
    (dict(world=4, dp=2, tp=2, zero=1), "--zero 1 applies"),
    (dict(world=4, dp=4, zero=4), "use 0 (DDP)"),
    (dict(world=4, dp=2, pp=2, batch_size=12), "does not split into 8 pieces"),
])
def test_impossible_configurations_refused_in_one_line(sizes, words):
    from source_code.capstone import choose
    with pytest.raises(LaunchError) as err:
        choose.plan(**sizes)
    assert words in err.value.message and "\n" not in err.value.message, err.value.message


@pytest.mark.parametrize("sizes, described", [
    (dict(world=4, dp=2, tp=2, zero=3), "DTensor TP on 2 x FSDP2 on 2"),
    (dict(world=2, pp=2), "1F1B pipeline on 2"),
    (dict(world=4, dp=4, zero=2), "ZeRO-2 on 4"),
    (dict(world=8, pp=2, dp=2, tp=2), "torch GPipe pipeline on 2 x DP on 2 x DTensor TP on 2"),
    (dict(world=8, dp=2, tp=2, cp=2), "DP on 2 x DTensor TP on 2 x ring attention on 2"),
    (dict(world=4, pp=2, tp=2), "torch GPipe pipeline on 2 x DTensor TP on 2"),
    (dict(world=4, tp=2, cp=2), "DTensor TP on 2 x ring attention on 2"),
    (dict(world=4, dp=2, ep=2), "expert parallel on 2 x DP on 2"),
])
def test_possible_configurations_named(sizes, described):
    from source_code.capstone import choose
    assert choose.plan(**sizes) == described


def test_every_combination_of_the_matrix_is_one_choose_accepts():
    """The planner and the matrix agree: each model-parallel combination of the matrix, at
    degree 2 per kind, is a configuration choose.plan accepts and builds."""
    from source_code.capstone import choose
    sizes = {"FSDP x TP": dict(dp=2, tp=2, zero=3), "DP x CP": dict(dp=2, cp=2),
             "EP x DP": dict(dp=2, ep=2), "PP x DP": dict(dp=2, pp=2),
             "PP x DP x TP": dict(pp=2, dp=2, tp=2), "DP x TP x CP": dict(dp=2, tp=2, cp=2)}
    combos = [n for n in matrix.NAMES if matrix.family(n) in ("two kinds (2 x 2)", "three kinds (2 x 2 x 2)")]
    assert sorted(combos) == sorted(sizes)
    for name in combos:
        assert choose.plan(matrix.world_of(name), **sizes[name])


def test_choose_entry_point_refuses_before_starting_processes():
    from source_code.capstone import choose
    with pytest.raises(LaunchError) as err:
        choose.main(["--world", "4", "--dp", "2", "--cp", "3"])
    assert "not the world size 4" in err.value.message


def _measure_holding():
    """compare.measure on 2 ranks of a model of 4 parameters, three runners: "split" (each rank
    holds two, as pipeline stages do), "drop" (no rank holds "b.bias"), "none" (returns {}).
    The verdict of each: its largest weight difference, or the error it raised."""
    import torch.distributed as dist
    from source_code.capstone import compare
    from source_code.capstone.runner import Runner
    want = {n: torch.full((2,), float(i)) for i, n in enumerate(("a.weight", "a.bias", "b.weight", "b.bias"))}
    out = {}
    for which, mine in (("split", list(want)[dist.get_rank()::2]), ("drop", list(want)[:3]), ("none", [])):
        runner = Runner(step=lambda x, y: 1.0, weights=lambda: {n: want[n].clone() for n in mine})
        try:
            out[which] = compare.measure(runner, [(None, None)], {"dense": ([1.0], want)})["param_diff"]
        except AssertionError as err:
            out[which] = str(err)
    return out


def test_weight_comparison_fails_on_a_missing_parameter():
    from source_code import processes
    from source_code.capstone import compare
    for got in processes.spawn(_measure_holding, 2, device="cpu", stream=False):
        assert got["split"] == 0.0, got
        for which in ("drop", "none"):
            assert re.search(r"no rank holds .*'b\.bias'", str(got[which])), got
    with pytest.raises(AssertionError, match="not in the one-process model"):
        compare.max_diff({"c.weight": torch.zeros(1)}, {"a.weight": torch.zeros(1)})


@pytest.mark.parametrize("sizes", [dict(dp_shard=2, tp=4, ep=2), dict(dp_replicate=2, dp_shard=2, tp=2, ep=2),
                                   dict(pp=2, cp=2, tp=4, ep=4), dict(dp_shard=4, cp=2, ep=4),
                                   dict(pp=2, dp_replicate=2, cp=2, tp=4, ep=2), dict(dp_shard=3, tp=2, ep=3),
                                   dict(dp_shard=3, tp=2, ep=6)])
def test_expert_gradient_group_of_torchtitans_sparse_mesh(sizes):
    """Summed over ("dp_replicate", "efsdp"), each expert's gradient is one process's; the dp x cp
    rule misses the tokens of the tp ranks outside the ep group unless tp divides ep."""
    from source_code.capstone import expert_groups as g
    assert g.check(g.expert_grad_group, **sizes) == 0
    world = g.layouts(**sizes)["sparse"].numel()
    efsdp = sizes.get("dp_shard", 1) * sizes.get("cp", 1) * sizes.get("tp", 1) // sizes["ep"]
    assert all(len(g.expert_grad_group(r, **sizes)) == sizes.get("dp_replicate", 1) * efsdp for r in range(world))
    rule_right = g.check(g.dp_cp_rule, **sizes) == 0
    assert rule_right == (sizes["ep"] % sizes.get("tp", 1) == 0), sizes


def test_expert_gradient_group_for_dp_shard_2_tp_4_ep_2():
    from source_code.capstone import expert_groups as g
    sizes = dict(dp_shard=2, tp=4, ep=2)
    assert g.ep_group(0, **sizes) == [0, 1]                    # two tp ranks of one dp_shard rank
    assert g.expert_grad_group(0, **sizes) == [0, 2, 4, 6]     # efsdp = 2 * 4 // 2 = 4 ranks
    assert g.dp_cp_rule(0, **sizes) == [0, 4]                  # the rule's group: half the tokens
    assert g.check(g.dp_cp_rule, **sizes) > 0
    with pytest.raises(ValueError, match="must divide dp_shard"):
        g.layouts(dp_shard=2, tp=2, ep=8)
