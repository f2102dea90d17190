"""The checks of context parallelism (notebook 13) and expert parallelism (notebook 14): 2+ GPUs.

Both scripts start their own processes (processes.spawn) and compare with one process; here
they run with ``--device auto`` (one GPU per process where there are enough, the device
policy's CPU fallback otherwise, which the check then reports as a failure on a GPU machine).
On a GPU the ring's transfers go through ``batch_isend_irecv`` over NCCL and torch's own
``context_parallel`` runs with a GPU attention kernel (on the CPU it has none).
"""
from __future__ import annotations

from source_code.gpu_smoke.harness import Check, Env, Run, computed_on, line_with
from source_code.training.loop import parse_records


def context_parallel(env: Env, check: Check) -> str:
    out = env.launch(check)
    where = computed_on(out, env, "context_parallel.compare")
    s = parse_records(out, "summary")[-1]
    tol = float(line_with(out, "tolerance").split()[1])
    assert s["cp_max_abs_diff"] <= tol and s["zigzag_work_imbalance"] <= 1.05, s
    if env.device == "cuda":   # the library's ring needs a GPU attention kernel: here it must run
        assert s["library"] == "ran", line_with(out, "torch context_parallel")
    return (f"ring attention on {where}: max diff {s['cp_max_abs_diff']:.1e} (tolerance {tol:g}), zigzag "
            f"imbalance {s['zigzag_work_imbalance']:.3f}, torch's context_parallel: {s['library']}")


def expert_parallel(env: Env, check: Check) -> str:
    out = env.launch(check)
    where = computed_on(out, env, "expert_parallel.compare")
    s = parse_records(out, "summary")[-1]
    assert s["ep_max_abs_diff"] <= s["tol"] and s["balance_loss_effect"] < 1, s
    return (f"MoE with all-to-all on {where}: max diff {s['ep_max_abs_diff']:.1e} over {s['cases']} cases "
            f"(tolerance {s['tol']:g}), balancing loss effect {s['balance_loss_effect']:.3f}")


CHECKS = [
    Check("context_parallel", 2, (Run("python", "source_code.context_parallel.compare",
                                      ("--worlds", "2", "--device", "auto")),), context_parallel),
    Check("expert_parallel", 2, (Run("python", "source_code.expert_parallel.compare",
                                     ("--device", "auto")),), expert_parallel),
]
