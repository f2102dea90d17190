"""torch's own context parallelism: ``torch.distributed.tensor.experimental.context_parallel``.

Inside ``with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2])`` the
buffers are cut in place along the sequence (head-tail, our zigzag, when the length is a
multiple of 2n) and ``F.scaled_dot_product_attention`` is replaced by a ring version. That
version is written for the fused GPU kernels (flash, memory-efficient, cuDNN attention); on
the CPU, SDPA runs another kernel, which the API does not handle, and raises. ``attempt``
runs it and says what happened, with the exception's own words when it fails, so a notebook
states it from the run; on GPUs it compares the library with full attention and with our
ring on the same inputs (the GPU check). Run on every rank (processes.spawn / torchrun).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from source_code.context_parallel import layout as lay
from source_code.context_parallel.harness import Shape, full_attention, inputs, max_diff
from source_code.context_parallel.comm import Ring
from source_code.context_parallel.ring import ring_attention
from source_code.distributed import context


def _library(q, k, v, dout, mesh, causal: bool):
    """The API as its docstring shows it: shard the buffers, call SDPA, backward."""
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.experimental import context_parallel
    bufs = [t.detach().clone() for t in (q, k, v, dout)]      # resized in place: no grad allowed
    with context_parallel(mesh, buffers=bufs, buffer_seq_dims=[2, 2, 2, 2], no_restore_buffers=set(bufs)):
        ql, kl, vl = (t.detach().clone().requires_grad_(True) for t in bufs[:3])
        with CommDebugMode() as comm:
            out = F.scaled_dot_product_attention(ql, kl, vl, is_causal=causal)
            out.backward(bufs[3])
    counts = {str(op).split(".")[-1]: c for op, c in comm.get_comm_counts().items()}
    return out.detach(), ql.grad, kl.grad, vl.grad, counts


def attempt(shape: Shape = Shape(), causal: bool = True) -> dict:
    """Library vs full attention vs our zigzag ring on this rank; or the error it raised."""
    device = context().device
    r, n = dist.get_rank(), dist.get_world_size()
    q, k, v, dout = inputs(shape, device)
    base = {"rank": r, "world": n, "device": device.type, "torch": torch.__version__}
    try:
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh(device.type, (n,))
        lib = _library(q, k, v, dout, mesh, causal)
    except Exception as exc:  # noqa: BLE001 - what the library did is the result
        dist.barrier()
        return {**base, "ran": False, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"}
    ref = full_attention(q, k, v, dout, causal)
    local = [lay.shard(t, r, n, "zigzag").requires_grad_(True) for t in (q, k, v)]
    ours = ring_attention(*local, causal=causal, layout="zigzag", ring=Ring())
    ours.backward(lay.shard(dout, r, n, "zigzag"))
    mine = [ours.detach()] + [t.grad for t in local]
    refs = [lay.shard(ref[key], r, n, "zigzag") for key in ("out", "dq", "dk", "dv")]
    return {**base, "ran": True, "comm": lib[4],
            "vs_full": max(max_diff(a, b) for a, b in zip(lib[:4], refs)),
            "vs_ours": max(max_diff(a, b) for a, b in zip(lib[:4], mine))}
