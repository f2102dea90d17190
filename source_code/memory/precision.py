"""Mixed precision counted: bytes per parameter, fp16's underflow and overflow, what bf16 loses.

    python -m source_code.memory.report      # its bytes-per-parameter line comes from here

Ways to train the same model, one AdamW step each, state bytes counted per parameter:

* ``fp32``: weights, gradients, AdamW's exp_avg and exp_avg_sq in fp32: 4 + 4 + 8 = 16;
* ``autocast``: fp32 weights, ``torch.autocast(dtype=bfloat16)`` runs the matmuls in bf16
  (casting the weights on the fly, 2 bytes a parameter during forward and backward): 16;
* ``bf16-mixed`` (mixed_precision.bf16_step_bytes, the ZeRO paper's and DeepSpeed's
  bookkeeping): bf16 weights and gradients, fp32 master weights and moments: 2 + 2 + 4 + 4 + 4 = 16;
* ``bf16-megatron`` (mixed_precision.megatron_step_bytes, Megatron-LM's): the same with the
  gradients accumulated in an fp32 buffer (main_grad): 2 + 4 + 12 = 18;
* ``fp16-scaler``: fp32 weights, ``autocast(dtype=float16)`` and ``torch.amp.GradScaler``: 16,
  plus the scale (one fp32 number);
* ``bf16-pure``: everything in bf16, no master copy: 2 + 2 + 4 = 8 bytes, and updates smaller
  than half the spacing of bf16 numbers around a weight are lost (``lost_updates``).

Mixed precision saves activation bytes and time (16-bit matmuls), not state bytes. fp16 has 5
exponent bits: gradients below 6e-8 become 0 (``underflow``), values above 65504 become inf
(``overflow``); GradScaler multiplies the loss by a scale so small gradients survive, divides
it out before the step, and skips a step whose gradients hold an inf or a NaN, halving the
scale. bf16 has fp32's 8 exponent bits and needs no scaling, but only 7 explicit mantissa bits
(8 counting the implicit leading one; fp16 and TF32 have 10 + 1, fp32 23 + 1): ``formats``
reads them from torch.finfo.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from source_code import workload
from source_code.measure import optimizer_tensors, tensor_bytes
from source_code.memory import mixed_precision

WAYS = ("fp32", "autocast", "bf16-mixed", "bf16-megatron", "fp16-scaler", "bf16-pure")
COUNTED = {"bf16-mixed": mixed_precision.bf16_step_bytes, "bf16-megatron": mixed_precision.megatron_step_bytes}


def _loss(model, x, y, dtype=None):
    with torch.autocast(x.device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        logits = model(x)
    return F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=-100)  # in fp32


def step_bytes(way: str, cfg: dict | None = None, batch_size: int = 8) -> dict:
    """{"n_params", "params", "grads", "optimizer", "total"} held after one step of ``way``."""
    cfg = cfg or workload.model_config()
    if way in COUNTED:
        b = COUNTED[way](cfg, batch_size=batch_size)
        return {k: b[k] for k in ("n_params", "params", "grads", "optimizer", "total")}
    if way not in WAYS:
        raise ValueError(f"unknown way {way!r}; choose one of {', '.join(WAYS)}")
    model = workload.build_model(cfg, 0)
    if way == "bf16-pure":
        model = model.to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = workload.global_batch(workload.sort_task(64), 0, batch_size)
    dtype = {"autocast": torch.bfloat16, "fp16-scaler": torch.float16}.get(way)
    loss = _loss(model, x, y, dtype)
    extra = []
    if way == "fp16-scaler":
        scaler = torch.amp.GradScaler("cpu")
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        extra = [scaler._scale]                       # the loss scale: one fp32 number
    else:
        loss.backward()
        opt.step()
    params = list(model.parameters())
    state = [t for t in optimizer_tensors(opt) if t.dim()]   # AdamW's step counters left out
    out = {"n_params": sum(p.numel() for p in params), "params": tensor_bytes(params),
           "grads": tensor_bytes([p.grad for p in params]),
           "optimizer": tensor_bytes(state + extra)}
    out["total"] = out["params"] + out["grads"] + out["optimizer"]
    return out


def per_parameter(ways=WAYS, cfg: dict | None = None) -> dict:
    """Bytes per parameter of each state, for each way: {way: {"params", ..., "total"}}."""
    out = {}
    for way in ways:
        b = step_bytes(way, cfg)
        out[way] = {k: b[k] / b["n_params"] for k in ("params", "grads", "optimizer", "total")}
    return out


def _tiny(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lin = torch.nn.Linear(16, 4)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(4, 16, generator=g))
    return lin, torch.randn(8, 16, generator=g)


def underflow(loss_factor: float = 1e-9, init_scale: float = 2.0 ** 16) -> dict:
    """fp16 autocast on a linear layer whose loss is tiny (gradients ~1e-9): the fraction of
    weight gradients that are 0 without and with GradScaler, and the scaled run's largest
    relative error against the same gradient computed in fp32."""
    lin, x = _tiny()
    out = {}
    for name, scale in (("unscaled", None), ("scaled", init_scale)):
        lin.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = lin(x).float().sum() * loss_factor
        if scale is None:
            loss.backward()
        else:
            scaler = torch.amp.GradScaler("cpu", init_scale=scale)
            scaler.scale(loss).backward()
            scaler.unscale_(torch.optim.SGD(lin.parameters(), lr=0.0))   # divides the scale out
        out[name] = lin.weight.grad.clone()
    lin.zero_grad()
    (lin(x).sum() * loss_factor).backward()                               # fp32 reference
    ref = lin.weight.grad
    return {"zero_fraction_unscaled": (out["unscaled"] == 0).float().mean().item(),
            "zero_fraction_scaled": (out["scaled"] == 0).float().mean().item(),
            "scaled_rel_error": ((out["scaled"] - ref).abs().max() / ref.abs().max()).item(),
            "grad_magnitude": ref.abs().max().item()}


def overflow(init_scale: float = 2.0 ** 16, loss_factor: float = 1e3) -> dict:
    """A step whose scaled gradients overflow fp16: GradScaler skips it (weights unchanged) and
    halves the scale; the next step, at the smaller scale, goes through."""
    lin, x = _tiny()
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
    before = lin.weight.detach().clone()
    scales, changed = [], []
    for factor in (loss_factor, 1e-3):                # a huge loss, then an ordinary one
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = lin(x).float().pow(2).sum() * factor
        scaler.scale(loss).backward()
        w = lin.weight.detach().clone()
        scaler.step(opt)                              # skipped when a gradient is inf or NaN
        scaler.update()
        scales.append(scaler.get_scale())
        changed.append(not torch.equal(w, lin.weight.detach()))
    return {"init_scale": init_scale, "scale_after_overflow": scales[0], "scale_after_next": scales[1],
            "skipped_overflow_step": not changed[0], "next_step_applied": changed[1],
            "weights_changed_in_all": not torch.equal(before, lin.weight.detach())}


def lost_updates(lr: float = 1e-4, steps: int = 100, n: int = 4096, seed: int = 0) -> dict:
    """Weights around 1 trained with SGD on a constant gradient of 1 (each step adds -lr): the
    fraction that moved at all when they are kept in bf16 vs an fp32 master copy rounded to
    bf16 afterwards (bf16 numbers near 1 are 2^-7 = 0.0078 apart: a step of 1e-4 rounds away)."""
    g = torch.Generator().manual_seed(seed)
    w0 = (1 + 0.1 * torch.rand(n, generator=g)).to(torch.bfloat16)
    pure, master = w0.clone(), w0.float()
    for _ in range(steps):
        pure -= lr * torch.ones_like(pure)            # the update rounds to nothing in bf16
        master -= lr                                  # accumulates in fp32
    return {"moved_pure_bf16": (pure != w0).float().mean().item(),
            "moved_fp32_master": (master.to(torch.bfloat16) != w0).float().mean().item(),
            "fp32_master_drift": (w0.float() - master).mean().item(), "expected_drift": lr * steps,
            "bf16_spacing_at_1": torch.finfo(torch.bfloat16).eps}


def formats() -> dict:
    """{dtype: (exponent bits, explicit mantissa bits)} from torch.finfo: the mantissa's bits
    are -log2(eps) (eps = 2^-explicit bits), the exponent's the rest of the width but the sign.
    TF32 is not a tensor dtype: fp32's exponent with fp16's 10 mantissa bits, inside the matmul."""
    out = {}
    for name, dt in (("fp32", torch.float32), ("fp16", torch.float16), ("bf16", torch.bfloat16)):
        info = torch.finfo(dt)
        mantissa = round(-math.log2(info.eps))
        out[name] = (info.bits - 1 - mantissa, mantissa)
    out["tf32"] = (out["fp32"][0], out["fp16"][1])
    return out
