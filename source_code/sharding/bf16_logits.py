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
* ``rounding_at_scale``: logits rounded to bf16, as they are and at a trained model's size. bf16
  keeps 8 significant bits (7 stored and the implicit one): neighbours are 2^-7 apart at 1, so
  round-to-nearest moves a number z by at most |z| 2^-8 (U). A token's loss L = logsumexp(z) - z_y
  has the gradient softmax(z) - onehot(y), whose absolute values sum to 2(1-p), p the target's
  probability; with every logit moved by at most d = max|z| U, L moves by at most 2(1-p) d to first
  order. Exactly: along the way each ratio p_j/p_y changes by at most a factor e^{2d}, so 1-p grows
  by at most that factor, and |dL| <= (1-p)(e^{2d} - 1) = 2(1-p) d (1 + d + ...). Since L >= 1-p,
  the loss's relative error is at most e^{2d} - 1, however confident the token.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

U = 2.0 ** -8            # bf16's unit roundoff: half the spacing 2^-7 at 1 (8 significant bits)


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
    is ``size`` on average (in fp32, as a model's) and make each token's target its top logit (a
    model that is right, as a trained one is on most tokens). Each token's error against its
    bound (1-p)(e^{2d} - 1), d = max|z| U (``err_over_bound_max``, at most 1 by the algebra above),
    against the first-order bound 2(1-p) d, and against the loss itself."""
    keep = targets != -100
    z, y = logits[keep].detach().double(), targets[keep]
    if size is not None:
        z = (z * (size / z.abs().amax(1).mean())).float().double()   # fp32 logits of that size
        y = z.argmax(1)
    top = z.abs().amax(1)
    loss = F.cross_entropy(z, y, reduction="none")
    err = (F.cross_entropy(z.float().to(torch.bfloat16).double(), y, reduction="none") - loss).abs()
    q, d = -torch.expm1(-loss), top * U               # 1 - p without cancellation; the largest move
    first, bound = 2 * q * d, q * torch.expm1(2 * d)
    rel = err[loss > 0] / loss[loss > 0]
    return {"top_mean": top.mean().item(), "top_max": top.max().item(),
            "loss_median": loss.median().item(),
            "err_over_bound_max": (err / bound).max().item(),
            "err_over_first_order_max": (err / first).max().item(),
            "second_order_max": (bound / first).max().item() - 1,   # the bound's allowance over first order
            "rel_err_over_bound_max": (rel / torch.expm1(2 * d[loss > 0])).max().item(),
            "rel_err_median": rel.median().item(), "rel_err_max": rel.max().item()}
