"""The planner against measurement: DDP, FSDP, TP, 2D, a pipeline and ZeRO-1/2/3 with gradient
accumulation on 4 CPU processes.

    python -m source_code.planner.check

For each configuration of measured.CONFIGS the planner predicts rank 0's bytes (mesh_memory:
parameters, gradients, optimizer state, activations; communication: the payload of each
collective kind in forward + backward) for the workshop's TransformerLM in fp32 with the same
batch; 4 processes train it and count the same quantities (measured.py). One table row per
(configuration, quantity), then the last line

    planner_max_rel_error=E      E = max |predicted - measured| / measured over all rows
"""
from __future__ import annotations

import argparse

from source_code import torch_versions
from source_code.errors import run_main
from source_code.planner import communication, mesh_memory
from source_code.planner.measured import CONFIGS, config_of, measure_all
from source_code.planner.spec import PRESETS

QUANTITIES = ("params", "grads", "optimizer", "activations", "all_reduce", "all_gather",
              "reduce_scatter", "send_recv")


def predict(name: str) -> dict:
    """The planner's bytes for configuration ``name`` (fp32, the workshop model)."""
    model, cfg = PRESETS["workshop"], config_of(name)
    out = dict(mesh_memory.per_gpu(model, cfg, "fp32"))
    for kind in ("all_reduce", "all_gather", "reduce_scatter", "send_recv"):
        out[kind] = 0
    for row in communication.per_step(model, cfg, gpus_per_node=4, prec="fp32"):
        out[row["kind"]] += row["payload"]
    return out


def compare(measured: dict) -> list[dict]:
    """Rows {config, quantity, predicted, measured, rel_error} (quantities both sides have)."""
    rows = []
    for name, got in measured.items():
        want = predict(name)
        for q in QUANTITIES:
            if got.get(q) is None or (got[q] == 0 and want[q] == 0):
                continue
            rel = abs(want[q] - got[q]) / max(got[q], 1)
            rows.append({"config": name, "quantity": q, "predicted": want[q], "measured": got[q],
                         "rel_error": rel})
    return rows


def format_table(rows: list[dict]) -> list[str]:
    out = [f"{'config':8s} {'quantity':15s} {'predicted B':>12s} {'measured B':>12s} {'rel.err':>8s}"]
    for r in rows:
        out.append(f"{r['config']:8s} {r['quantity']:15s} {r['predicted']:12,.0f} "
                   f"{r['measured']:12,.0f} {r['rel_error']:8.4f}")
    return out


def run(world_size: int = 4) -> list[dict]:
    from source_code.processes import spawn
    measured = spawn(measure_all, world_size, device="cpu")[0]
    return compare(measured)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tol", type=float, default=0.10)
    args = p.parse_args(argv)
    torch_versions.require("fsdp2", "cpu")  # the counted runs shard with FSDP2 on the CPU
    torch_versions.require("gpipe", "cpu")  # and one of them is a library pipeline
    rows = run()
    print("\n".join(format_table(rows)))
    worst = max(r["rel_error"] for r in rows)
    print(f"configs: {', '.join(f'{n}=pp{p}xdp{d}xtp{t}/zero{z}/m{m}' for n, (d, t, z, p, m) in CONFIGS.items())}")
    print(f"planner_max_rel_error={worst:.4f}")
    return 0 if worst <= args.tol else 1


if __name__ == "__main__":
    run_main(main)
