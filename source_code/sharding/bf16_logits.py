"""What a bf16 policy does to the logits, the loss and the gradient into the head (notebook 09).

FSDP2's ``MixedPrecisionPolicy(param_dtype=bfloat16, output_dtype=float32)`` on the root runs
the head's matmul in bf16 and then casts its output up (``_cast_output_dtype``, a ``.to``): the
logits are bf16 numbers in an fp32 tensor, and the backward of that cast rounds the loss's fp32
gradient back to bf16 before the head's backward. What stays in fp32 is the loss arithmetic
(log-softmax, the per-token losses, their mean). Logits with fp32's bits need the head in an fp32
group of its own.

* ``head_signals``: on every rank, forward + backward of a batch; the logits, their fp32
  gradient and the gradient the head's output receives (a hook on ``model.head``).
* ``policy_report``: the policy run and an fp32-head run against the fp32 model, like for like.
* ``loss_arithmetic``: the same logits through ``F.cross_entropy`` in bf16 and in fp32 (what
  ``output_dtype`` changes), torch's bf16 mean, and a running sum kept in bf16 by hand.
* ``rounding_at_scale``: logits rounded to bf16 at a trained model's size: each token's loss is
  off by about its largest logit x 2^-9 in absolute terms, whatever the loss.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

ULP = 2.0 ** -9          # half a bf16 spacing, relative: 8 significant bits


def correct_bits(got: torch.Tensor, want: torch.Tensor) -> float:
    """-log2 of the relative error ||got - want|| / ||want||: bf16 keeps 8 significant bits, fp32 24."""
    return -math.log2(((got.double() - want.double()).norm() / want.double().norm()).item())


def head_signals(model, xs, ys):
    """Forward + backward of (xs, ys) on every rank (FSDP's collectives need all of them).
    Returns (logits, their gradient, the gradient the head's output received), tokens flattened,
    and the loss."""
    got = {}

    def keep_output(module, inputs, output):
        output.register_hook(lambda g: got.__setitem__("head_grad", g))

    hook = model.head.register_forward_hook(keep_output)
    logits = model(xs)
    logits.retain_grad()
    loss = F.cross_entropy(logits.flatten(0, 1), ys.flatten(), ignore_index=-100)
    loss.backward()
    hook.remove()
    return (logits.detach().flatten(0, 1), logits.grad.flatten(0, 1),
            got["head_grad"].flatten(0, 1), loss.detach())


def _bf16_valued(z: torch.Tensor) -> bool:
    return torch.equal(z, z.to(torch.bfloat16).float())


def _name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def policy_report(runs: dict, targets: torch.Tensor) -> dict:
    """runs: name -> head_signals(...) for "fp32", "bf16" (the policy) and "fp32_head" (the policy
    with the head in its own fp32 group). Each compared with the fp32 model on the same tokens."""
    keep = targets != -100
    y = targets[keep]
    z32, g32 = runs["fp32"][:2]
    loss32 = F.cross_entropy(z32[keep], y, reduction="none")
    out = {"tokens": int(keep.sum())}
    for name in ("bf16", "fp32_head"):
        z, g, head_grad = runs[name][:3]
        loss = F.cross_entropy(z[keep], y, reduction="none")   # in fp32, as output_dtype gives
        out.update({f"{name}_logits_dtype": _name(z.dtype), f"{name}_logits_bf16_valued": _bf16_valued(z),
                    f"{name}_head_grad_dtype": _name(head_grad.dtype),
                    # the cast's backward: the head receives the logits' fp32 gradient rounded
                    f"{name}_head_grad_is_rounded": torch.equal(head_grad, g.to(head_grad.dtype)),
                    f"{name}_logit_bits": correct_bits(z, z32), f"{name}_loss_bits": correct_bits(loss, loss32),
                    f"{name}_grad_bits": correct_bits(head_grad, g32)})
    return out


def loss_arithmetic(logits: torch.Tensor, targets: torch.Tensor) -> dict:
    """The same bf16-valued logits through F.cross_entropy in bf16 (no output_dtype) and in fp32
    (output_dtype=float32): per token and as torch's own mean; then the bf16 per-token losses
    added one after another into a bf16 accumulator kept by hand.
    ``spacing``: the gap between bf16 numbers at the exact mean of the bf16 per-token losses."""
    keep = targets != -100
    y = targets[keep]
    z16 = logits[keep].detach().to(torch.bfloat16)
    z32 = z16.float()                                        # the same numbers, fp32 arithmetic
    loss32, loss16 = (F.cross_entropy(z, y, reduction="none") for z in (z32, z16))
    mean32, mean16 = F.cross_entropy(z32, y), F.cross_entropy(z16, y)   # torch's own reduction
    terms = loss16.cpu()                                     # bf16 per-token losses
    exact = terms.double().mean().item()
    acc, lost = torch.zeros((), dtype=torch.bfloat16), 0
    for t in terms:                                         # a running sum kept in bf16
        nxt = acc + t
        lost += bool(nxt == acc)
        acc = nxt
    return {"tokens": terms.numel(), "ce_bits": correct_bits(loss16, loss32),
            "fp32_mean": mean32.item(), "bf16_mean": mean16.item(), "bf16_terms_exact_mean": exact,
            "by_hand_bf16_mean": acc.item() / terms.numel(), "lost": lost,
            "spacing": 2.0 ** (math.floor(math.log2(abs(exact))) - 7)}   # 8 significant bits


def rounding_at_scale(logits: torch.Tensor, targets: torch.Tensor, size: float | None = None) -> dict:
    """Logits rounded to bf16 (the head's bf16 output), each token's loss taken in fp64 from them
    and from the unrounded ones. ``size``: first scale the logits so each token's largest |logit|
    is ``size`` on average and make each token's target its top logit (a model that is right, as
    a trained one is on most tokens). The error of each token's loss in units of its largest
    |logit| x 2^-9, and against the loss itself."""
    keep = targets != -100
    z, y = logits[keep].detach().double(), targets[keep]
    if size is not None:
        z = z * (size / z.abs().amax(1).mean())
        y = z.argmax(1)
    top = z.abs().amax(1)
    loss = F.cross_entropy(z, y, reduction="none")
    err = (F.cross_entropy(z.float().to(torch.bfloat16).double(), y, reduction="none") - loss).abs()
    rel = err[loss > 0] / loss[loss > 0]
    return {"top_mean": top.mean().item(), "loss_median": loss.median().item(),
            "err_in_logit_ulps_max": (err / (top * ULP)).max().item(),
            "rel_err_median": rel.median().item(), "rel_err_max": rel.max().item()}
