"""The checks of context parallelism (notebook 13), expert parallelism (notebook 14) and sharded
validation (notebook 05): 2+ GPUs.

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
    # the other families: all-gather of K/V (NCCL all_gather / reduce_scatter), Ulysses (all-to-all)
    assert s["ulysses_max_abs_diff"] <= tol and s["allgather_max_abs_diff"] <= tol, s
    if env.device == "cuda":   # the library's ring needs a GPU attention kernel: here it must run
        assert s["library"] == "ran", line_with(out, "torch context_parallel")
    return (f"ring attention on {where}: max diff {s['cp_max_abs_diff']:.1e} (tolerance {tol:g}), "
            f"all-gather {s['allgather_max_abs_diff']:.1e}, Ulysses {s['ulysses_max_abs_diff']:.1e}, zigzag "
            f"imbalance {s['zigzag_work_imbalance']:.3f}, torch's context_parallel: {s['library']}")


def expert_parallel(env: Env, check: Check) -> str:
    out = env.launch(check)
    where = computed_on(out, env, "expert_parallel.compare")
    s = parse_records(out, "summary")[-1]
    assert s["ep_max_abs_diff"] <= s["tol"] and s["balance_loss_effect"] < 1, s
    assert s["aux_free_balance_effect"] < 1 and s["dropless_dropped"] == 0, s
    return (f"MoE with all-to-all on {where}: max diff {s['ep_max_abs_diff']:.1e} over {s['cases']} cases "
            f"(tolerance {s['tol']:g}), balancing loss effect {s['balance_loss_effect']:.3f}, "
            f"aux-free bias effect {s['aux_free_balance_effect']:.3f}, dropless dropped 0")


def moe_bench(env: Env, check: Check) -> str:
    out = env.launch(check)
    where = computed_on(out, env, "expert_parallel.bench")
    s = parse_records(out, "summary")[-1]
    assert s["world_size"] == 2 and s["a2a_over_allgather"] > 0 and s["skew_time_ratio"] > 0, s
    return (f"all-to-all beside all-gather on {where}: time ratio {s['a2a_over_allgather']:.2f}, "
            f"skewed dispatch {s['skew_time_ratio']:.2f}x the even one")


def evaluation(env: Env, check: Check) -> str:
    out = env.launch(check)
    where = computed_on(out, env, "training.evaluation")
    s = parse_records(out, "summary")[-1]
    assert s["sharded_error"] == 0, s   # integer counts summed then divided: exact
    return f"validation sharded over {s['world_size']} ranks on {where}: exact against rank 0 alone"


CHECKS = [
    Check("context_parallel", 2, (Run("python", "source_code.context_parallel.compare",
                                      ("--worlds", "2", "--device", "auto")),), context_parallel),
    Check("expert_parallel", 2, (Run("python", "source_code.expert_parallel.compare",
                                     ("--device", "auto")),), expert_parallel),
    Check("moe_bench", 2, (Run("python", "source_code.expert_parallel.bench",
                               ("--world", "2", "--reps", "3", "--tokens", "2048", "--device", "auto")),),
          moe_bench),
    Check("evaluation", 2, (Run("torchrun", "source_code.training.evaluation", ("--samples", "359"),
                                nproc=2),), evaluation),
]
