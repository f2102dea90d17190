"""Pseudo-gradients sent in fewer bits and summed in fp32, as Streaming DiLoCo sends its outer gradients.

Each ``average_*(tensors)`` replaces every tensor by its mean over the workers, in place (the
``average`` of ``local_sgd``), with the values on the wire in fewer bits:

    average_fp16   the values cast to fp16 (2 bytes)
    average_e3m0   the values in 4 bits each: a sign and a 3-bit exponent, no mantissa (E3M0),
                   times the largest magnitude of the buffer (one fp32 scale per worker):
                   each value becomes 0 or +-scale x 2^-k, k = 0..6, the nearest of those

Low precision on the wire, fp32 in the sum: each worker's low-precision buffer is gathered
(``all_gather``) and the workers' values are summed in fp32 on every worker. Summing in fp16
(an all-reduce of fp16 buffers) rounds every partial sum to fp16 and can overflow with many
workers; Streaming DiLoCo (Douillard et al., 2025) sends 4-bit outer gradients and keeps the
accumulation in fp32. With 2 workers the gather sends what a ring all-reduce would; with many
it sends (n - 1) buffers a worker instead of the ring's 2 (n - 1) / n. torchft's
``allreduce_quantized`` keeps the ring's bytes another way: each worker sends the quantized
chunks all-to-all, sums its own chunk in higher precision, and all-gathers the sums in low
precision (a reduce-scatter in fp32 would send full-precision bytes).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

MIN_EXPONENT = -6          # 3 exponent bits: codes 1..7 are 2^-6 .. 2^0, code 0 is zero


def _gather_sum(low: torch.Tensor) -> list:
    """Every worker's ``low`` (same shape), gathered: the list of them."""
    got = [torch.empty_like(low) for _ in range(dist.get_world_size())]
    dist.all_gather(got, low)
    return got


def _write_back(tensors, flat: torch.Tensor) -> None:
    offset = 0
    for t in tensors:
        t.copy_(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()


def average_fp16(tensors) -> None:
    flat = torch.cat([t.reshape(-1) for t in tensors])
    total = sum(x.float() for x in _gather_sum(flat.to(torch.float16)))     # fp32 accumulation
    _write_back(tensors, total / dist.get_world_size())


LEVELS = torch.tensor([0.0] + [2.0 ** e for e in range(MIN_EXPONENT, 1)])   # code -> magnitude


def e3m0_encode(flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(4-bit codes packed two to a byte, fp32 scale) of a flat fp32 tensor."""
    scale = flat.abs().max().clamp_min(torch.finfo(torch.float32).tiny)
    mag = flat.abs() / scale                                            # in [0, 1]
    code = (mag[:, None] - LEVELS.to(flat.device)).abs().argmin(dim=1)  # the nearest level
    nibble = code.to(torch.uint8) | ((flat < 0).to(torch.uint8) << 3)   # sign in bit 3
    if nibble.numel() % 2:
        nibble = torch.cat([nibble, nibble.new_zeros(1)])
    return nibble[0::2] | (nibble[1::2] << 4), scale.reshape(1)


def e3m0_decode(packed: torch.Tensor, scale: torch.Tensor, n: int) -> torch.Tensor:
    nibble = torch.stack([packed & 0xF, packed >> 4], dim=1).reshape(-1)[:n]
    sign = 1.0 - 2.0 * ((nibble >> 3) & 1).float()
    return sign * LEVELS.to(packed.device)[(nibble & 0x7).long()] * scale


def average_e3m0(tensors) -> None:
    flat = torch.cat([t.reshape(-1) for t in tensors])
    packed, scale = e3m0_encode(flat)
    codes, scales = _gather_sum(packed), _gather_sum(scale)
    total = sum(e3m0_decode(c, s, flat.numel()) for c, s in zip(codes, scales))   # fp32
    _write_back(tensors, total / dist.get_world_size())
