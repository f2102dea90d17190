"""The check of memory, precision and recomputation (notebook 08): one GPU.

On a GPU the report counts activations with the CUDA kernels' own saved tensors (the formula
must still hold), sets the caching allocator's peak beside the counted peak, and draws a
memory snapshot (``torch.cuda.memory._record_memory_history``) to a PNG.
"""
from __future__ import annotations

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
        text += f"; allocator peak / counted peak {gpu['allocator_ratio']:.2f}, snapshot drawn"
    return text


CHECKS = [
    Check("memory_precision", 1, (Run("python", "source_code.memory.report",
                                      ("--device", "auto", "--snapshot", f"{TMP}/memory_timeline.png")),),
          memory_precision, gpu_only="the caching allocator's peak and its snapshot need a GPU"),
]
