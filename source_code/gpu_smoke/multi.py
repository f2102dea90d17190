"""The checks that need 2 or more GPUs: the multi-rank paths over NCCL, one process per GPU.

Own ring and parameter server (3 GPUs), own DDPs vs torch DDP, ZeRO by hand and FSDP2 on 2
ranks, a DCP checkpoint saved by 2 ranks and resumed on 1, pipeline schedules (own and the
library's) on 2 stages, tensor parallelism (own and DTensor) on 2, the hang drill; with 4 GPUs
the 2 x 2 mesh (FSDP2 x tensor parallel). Where the GPUs are missing the line says
``skipped: needs 2 gpus``; ``--device cpu`` runs the same commands on as many CPU processes.
"""
from __future__ import annotations

import re

from source_code.gpu_smoke.harness import EVERY_GPU, TMP, Check, Env, Run, computed_on, line_with
from source_code.gpu_smoke.single import _reduce_both
from source_code.processes import spawn
from source_code.training.loop import parse_summary

SHORT_PIPELINE = ("--epochs", "1", "--max-steps", "8")
SHORT_TP = ("--epochs", "1", "--max-steps", "8")
SHARDING, TP = "source_code.sharding.train", "source_code.tensor_parallel.train"


def _ring_and_server() -> dict:
    from source_code.sync.harness import compare_with_library
    return compare_with_library(sizes=(5, 4099))


def nccl_multi(env: Env, check: Check) -> str:
    n = env.nproc(check, check.runs[0])
    res = spawn(_reduce_both, n)
    want = n * (n + 1) / 2
    assert all(r["device"] == f"cuda:{i}" for i, r in enumerate(res)), res
    assert all(r["device_sum"] == want and r["cpu_sum"] == want for r in res), res
    return f"{n} ranks on {n} GPUs: NCCL and gloo sums equal {want:g}"


def main_job_multi(env: Env, check: Check) -> str:
    out = env.launch(check)
    where = computed_on(out, env, "training.ddp")
    s = parse_summary(out)
    return f"{s['world_size']} processes (rank 0 on {where}): accuracy {s['accuracy']:.3f}"


def ring(env: Env, check: Check) -> str:
    worst = max(max(r.values()) for r in spawn(_ring_and_server, 3, device=env.policy))
    assert worst <= 1e-6, worst
    return f"ring, naive ring and parameter server equal dist.all_reduce (max diff {worst:.1e})"


def ddp_compare(env: Env, check: Check) -> str:
    out = env.launch(check)  # exits non-zero when the weights differ by more than its --tol
    line = line_with(out, "compare: max_abs_diff")
    diffs = [float(v) for v in re.findall(r"max_abs_diff\[[^]]+\]=(\S+)", line)]
    assert diffs and max(diffs) <= 1e-5, diffs
    where = computed_on(out, env, "ddp_internals.compare")
    ratio = line_with(out, "per-step ratio").split(": ", 1)[1]
    return f"on {where}: weights equal to {max(diffs):.1e}; per-step time / torch DDP: {ratio}"


def zero_multi(env: Env, check: Check) -> str:
    out = env.launch(check)  # exits 1 (a FAIL here) when any implementation differs by > 1e-6
    lines = [re.sub(r"parity: impl=(\S+) .*max_abs_diff=(\S+)", r"\1 \2", ln)
             for ln in out.splitlines() if ln.startswith("parity: impl=")]
    assert len(lines) == 4, out[-400:]
    where = computed_on(out, env, "sharding.parity")
    return f"2 ranks on {where}, max_abs_diff vs one process: " + ", ".join(lines)


def sharding_reshard(env: Env, check: Check) -> str:
    first = env.launch(check, 0)
    where = computed_on(first, env, "sharding.train")
    second = env.launch(check, 1)
    assert "saved by 2 ranks" in second and "after epoch 1" in second, second[-400:]
    computed_on(second, env, "sharding.train")
    return (f"DCP saved by 2 ranks on {where}, resumed on 1: "
            f"accuracy {parse_summary(second)['accuracy']:.3f}")


def trained_runs(env: Env, check: Check, module: str) -> str:
    """Every run of the check: its flags (those before --epochs), the device it names, the
    accuracy of its summary line."""
    parts = []
    for i, run in enumerate(check.runs):
        out = env.launch(check, i)
        where = computed_on(out, env, module)
        flags = " ".join(run.args[:run.args.index("--epochs")])
        parts.append(f"{flags} on {where}: accuracy {parse_summary(out)['accuracy']:.3f}")
    return "; ".join(parts)


def pipeline(env: Env, check: Check) -> str:
    return "2 stages, " + trained_runs(env, check, "pipeline.train")


def tensor_parallel(env: Env, check: Check) -> str:
    return "2 ranks, " + trained_runs(env, check, "tensor_parallel.train")


def tp_compare(env: Env, check: Check) -> str:
    out = env.launch(check)
    where = computed_on(out, env, "tensor_parallel.compare")
    parity = line_with(out, "parity")
    times = line_with(out, "step time median")
    return f"on {where}: {parity.split(': ', 1)[1]}; {times}"


def hang(env: Env, check: Check) -> str:
    out = env.launch(check)
    s = parse_summary(out)
    assert s["hang_detected"] == 1, f"the drill's hang was not detected: {out[-400:]}"
    # the drill is pinned to gloo on the CPU on every machine (profiling/hang.py says why: NCCL's
    # watchdog aborts instead of raising); on a GPU node it must say so, and still catch the hang
    if env.device == "cuda":
        assert "on cpu on purpose" in out, f"the drill did not say it runs on the CPU: {out[-400:]}"
    return (f"2 ranks with gloo on cpu (on purpose): {line_with(out, 'hang detected')}; first "
            f"mismatch at collective {s['mismatch_at']}")


def mesh_2d(env: Env, check: Check) -> str:
    out = env.launch(check)
    where = computed_on(out, env, "mesh.train_2d")
    s = parse_summary(out)
    assert (s["dp"], s["tp"]) == (2, 2), s
    mesh = line_with(out, "2D training: mesh").split(" (")[0].replace("2D training: ", "")
    return f"{mesh} (dp=2 x tp=2) on {where}: {s['steps']} steps, loss {s['loss']:.4f}"


def _train(module, *args, nproc=None):
    return Run("torchrun", module, args, nproc=nproc)


CHECKS = [
    Check("nccl_multi", 2, (Run("spawn", "source_code.gpu_smoke.single", ("_reduce_both()",),
                                nproc=EVERY_GPU),), nccl_multi, gpu_only="needs 2 gpus (NCCL between ranks)"),
    Check("main_job_multi", 2, (_train("source_code.training.ddp", "--epochs", "2", nproc=EVERY_GPU),),
          main_job_multi),
    Check("ring", 3, (Run("spawn", "source_code.sync.harness", ("compare_with_library(sizes=(5, 4099))",)),),
          ring),
    Check("ddp_compare", 2, (_train("source_code.ddp_internals.compare", "--steps", "10", "--warmup", "2"),),
          ddp_compare),
    Check("zero_multi", 2, (_train("source_code.sharding.parity", "--steps", "3"),), zero_multi),
    Check("sharding_reshard", 2, (_train(SHARDING, "--epochs", "1", "--checkpoint", f"{TMP}/dcp2"),
                                  _train(SHARDING, "--epochs", "2", "--checkpoint", f"{TMP}/dcp2", "--resume",
                                         nproc=1)), sharding_reshard),
    Check("pipeline_own", 2, tuple(_train("source_code.pipeline.train", "--schedule", s, *SHORT_PIPELINE)
                                   for s in ("gpipe", "1f1b")), pipeline),
    Check("pipeline_lib", 2, tuple(_train("source_code.pipeline.train", "--schedule", s, *SHORT_PIPELINE)
                                   for s in ("lib-gpipe", "lib-1f1b")), pipeline),
    Check("tp_own", 2, (_train(TP, "--impl", "own", *SHORT_TP),
                        _train(TP, "--impl", "own", "--sequence-parallel",
                               "--vocab-parallel", *SHORT_TP)), tensor_parallel),
    Check("tp_dtensor", 2, (_train(TP, "--impl", "dtensor", *SHORT_TP),
                            _train(TP, "--impl", "dtensor", "--sequence-parallel",
                                   "--vocab-parallel", *SHORT_TP)), tensor_parallel),
    Check("tp_compare", 2, (_train("source_code.tensor_parallel.compare", "--steps", "5"),), tp_compare),
    Check("hang", 2, (_train("source_code.profiling.hang", "--timeout", "5", "--trace-dir", f"{TMP}/hang"),),
          hang),
    Check("mesh_2d", 4, (_train("source_code.mesh.train_2d", "--tp", "2", "--steps", "5"),), mesh_2d),
]
