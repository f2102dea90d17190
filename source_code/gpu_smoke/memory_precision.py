"""The checks of memory, precision and recomputation (notebook 08) and of FSDP by hand in
bf16 (notebook 09): one GPU.

On a GPU the report counts activations with the CUDA kernels' own saved tensors (the formula
must still hold), sets the caching allocator's peak beside the counted peak, and draws a
memory snapshot (``torch.cuda.memory._record_memory_history``) to a PNG.
"""
from __future__ import annotations

import json
from pathlib import Path

from source_code.gpu_smoke.harness import TMP, Check, Env, Run, computed_on
from source_code.training.loop import parse_records


def memory_precision(env: Env, check: Check) -> str:
    out = env.launch(check)
    where = computed_on(out, env, "memory.report")
    s = parse_records(out, "summary")[-1]
    assert s["activation_bytes_rel_error"] <= 0.01 and s["recompute_memory_ratio"] < 1, s
    text = (f"on {where}: activation bytes vs formula {s['activation_bytes_rel_error']:.1e}, "
            f"full recomputation keeps {s['recompute_memory_ratio']:.2f} of the peak")
    if env.device == "cuda":
        gpu = parse_records(out, "gpu")[-1]
        assert Path(env.tmp, "memory_timeline.png").exists(), "no memory snapshot figure"
        # the same ratio seen by the caching allocator: full recomputation's peak over none's
        assert abs(gpu["allocator_ratio"] - s["recompute_memory_ratio"]) <= 0.1, (gpu, s)
        text += (f"; the allocator's peak agrees: {gpu['allocator_ratio']:.2f} of the peak with "
                 f"full recomputation, snapshot drawn")
    return text


def allocator(env: Env, check: Check) -> str:
    """Growing requests: the default caching allocator reserves far more than it allocates;
    expandable_segments keeps the two close (each setting in its own process)."""
    s = parse_records(env.launch(check), "summary")[-1]
    default, expandable = s["default_reserved_over_allocated"], s["expandable_reserved_over_allocated"]
    assert default > 1.5 and expandable < default, s
    return f"reserved / allocated: default {default:.2f}, expandable_segments {expandable:.2f}"


def offload(env: Env, check: Check) -> str:
    """save_on_cpu on a GPU: every packed tensor really copied to pinned host memory, the
    gradients as the plain step's, the activations out of GPU memory."""
    out = env.launch(check)
    s = parse_records(out, "summary")[-1]
    assert str(s["device"]).startswith("cuda") and s["pin_memory"] in (True, "True"), s
    assert s["copied_bytes"] == s["packed_bytes"] > 0 and s["max_abs_grad_diff"] <= 1e-6, s
    assert s["peak_offload_mib"] < s["peak_plain_mib"], s
    return (f"{s['copied_bytes'] / 2**20:.2f} MiB copied to pinned host memory, peak "
            f"{s['peak_plain_mib']:.1f} -> {s['peak_offload_mib']:.1f} MiB, grad diff "
            f"{s['max_abs_grad_diff']:.1e}, {s['time_ratio']:.2f}x the step time")


def own_fsdp_bf16(env: Env, check: Check) -> str:
    """FSDP by hand in bf16 (own_fsdp_mixed.py) against fully_shard with MixedPrecisionPolicy:
    the all-gathers carry half the bytes of fp32, the reduce-scatters the same (fp32 reduce),
    and the two bf16 implementations agree (same cuBLAS calls on one GPU)."""
    out = env.launch(check)
    where = computed_on(out, env, "sharding.own_fsdp_report")
    r = json.loads(Path(env.tmp, "own1.json").read_text())
    comm, by, par = r["comm"], r["bytes"], r["parity"]
    assert comm["own_fsdp_bf16"]["all_gather"] * 2 == comm["own_fsdp"]["all_gather"], comm
    assert comm["own_fsdp_bf16"]["reduce_scatter"] == comm["own_fsdp"]["reduce_scatter"], comm
    assert by["own_fsdp_bf16"]["gathered"] * 2 == by["own_fsdp"]["gathered"], by
    d, drift = (par["own_fsdp_bf16_vs_fully_shard_bf16"]["max_abs_diff"],
                par["own_fsdp_bf16_vs_own_fsdp"]["max_abs_diff"])
    assert d <= 1e-6 < drift, par
    return (f"on {where}: bf16 all-gather {comm['own_fsdp_bf16']['all_gather']} B (fp32 "
            f"{comm['own_fsdp']['all_gather']} B), own vs fully_shard in bf16 {d:.1e}, "
            f"bf16 vs fp32 {drift:.1e}")


CHECKS = [
    Check("memory_precision", 1, (Run("python", "source_code.memory.report",
                                      ("--device", "auto", "--snapshot", f"{TMP}/memory_timeline.png")),),
          memory_precision, gpu_only="the caching allocator's peak and its snapshot need a GPU"),
    Check("allocator", 1, (Run("python", "source_code.memory.allocator"),), allocator,
          gpu_only="reserved vs allocated is the CUDA caching allocator's"),
    Check("offload", 1, (Run("python", "source_code.memory.offload", ("--device", "auto")),), offload,
          gpu_only="save_on_cpu moves nothing on a CPU"),
    Check("own_fsdp_bf16", 1, (Run("torchrun", "source_code.sharding.own_fsdp_report",
                                   ("--out", f"{TMP}/own1.json")),), own_fsdp_bf16),
]
