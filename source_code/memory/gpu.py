"""On a GPU only: the CUDA caching allocator's peak and a memory snapshot of a training step.

    python -m source_code.memory.report --device auto --snapshot images/08_gpu_timeline.png

``torch.cuda.max_memory_allocated`` is the most the allocator handed out since the last
``reset_peak_memory_stats``: tensor bytes rounded up to its 512-byte blocks, plus what
libraries asked it for (cuBLAS workspaces). Set beside live.LiveBytes' count of the same step
(tensor bytes, no rounding), the two should differ by those extras only. A snapshot
(``torch.cuda.memory._record_memory_history`` then ``_snapshot``) lists every allocation and
free with its size; summed in order it is the timeline of allocated bytes drawn here, one step
without recomputation, then one with full checkpointing. (Upload the pickled snapshot to
https://pytorch.org/memory_viz to see each allocation's stack.) On the CPU none of this
exists: the notebook counts tensor bytes instead.
"""
from __future__ import annotations

import torch

from source_code.memory import recompute
from source_code.memory.live import LiveBytes

MODES = ("none", "full")


def _trace_len(device) -> int:
    return len(torch.cuda.memory._snapshot()["device_traces"][device.index or 0])


def allocator_vs_counted(model, batch: int, seq: int, png: str | None = None) -> dict:
    """Per mode: {"allocator_peak", "counted_peak"} bytes above what the step found allocated;
    with ``png`` the snapshot's timeline is drawn there."""
    device = next(model.parameters()).device
    x, y = recompute.random_tokens(model, batch, seq, device)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    recompute.loss_of(model, x, y).backward()            # warm up: cuBLAS handles, workspaces
    torch.cuda.synchronize(device)
    out, marks = {}, {}
    torch.cuda.memory._record_memory_history(max_entries=200_000)
    try:
        for mode in MODES:
            start = _trace_len(device)
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
            recompute.loss_of(model, x, y, mode).backward()
            torch.cuda.synchronize(device)
            out[mode] = {"allocator_peak": torch.cuda.max_memory_allocated(device) - base}
            marks[mode] = (start, _trace_len(device))
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    for mode in MODES:
        out[mode]["counted_peak"] = recompute.memory_of(model, x, y, mode)["peak"]
    out["allocator_ratio"] = out["full"]["allocator_peak"] / out["none"]["allocator_peak"]
    if png:
        from source_code.memory.figures import timeline_figure
        now, allocated = 0, []
        for event in snapshot["device_traces"][device.index or 0]:
            if event["action"] == "alloc":
                now += event["size"]
            elif event["action"] == "free_completed":
                now -= event["size"]
            allocated.append(now)
        fig = timeline_figure(range(len(allocated)), allocated, marks)
        fig.savefig(png, dpi=110, bbox_inches="tight")
    return out


def tf32_note() -> str:
    """TF32 (Ampere and newer): fp32 matmuls on tensor cores with a 10-bit mantissa."""
    return (f"TF32 matmuls allowed: {torch.backends.cuda.matmul.allow_tf32} (set "
            "torch.backends.cuda.matmul.allow_tf32 = True or torch.set_float32_matmul_precision('high') "
            "for fp32 training on tensor cores; parity checks turn it off)")
