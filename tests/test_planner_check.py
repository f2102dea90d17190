"""The planner against counted bytes of real DDP, FSDP, TP, 2D and pipeline runs on 4 processes."""
import pytest

from source_code.planner import check

pytestmark = pytest.mark.parity


def test_planner_predicts_measured_bytes_within_10_percent():
    rows = check.run()
    print("\n".join(check.format_table(rows)))
    worst = max(r["rel_error"] for r in rows)
    print(f"planner_max_rel_error={worst:.4f}")
    assert {r["config"] for r in rows} == {"ddp", "fsdp", "tp", "2d", "pp_dp"}
    kinds = {(r["config"], r["quantity"]) for r in rows}
    assert {("2d", "all_reduce"), ("2d", "all_gather"), ("2d", "reduce_scatter"),
            ("tp", "all_reduce"), ("ddp", "all_reduce"), ("fsdp", "all_gather"),
            ("pp_dp", "send_recv"), ("pp_dp", "all_reduce")} <= kinds
    assert worst <= 0.10
