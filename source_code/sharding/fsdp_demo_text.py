"""Notebook 09's reading of fsdp_demo.py's lines: the bf16 running sums in spacings, and the
bullets the cell shows (the cell asserts the claims; this only words them).

    from source_code.sharding.fsdp_demo_text import bullets, running_sums
"""
from __future__ import annotations

import math


def running_sums(ar: dict) -> dict:
    """The bf16_loss_arithmetic line's means in bf16 spacings from the exact mean of the same bf16
    per-token losses, and where the hand-kept bf16 sum stopped (with the spacing there)."""
    spacing, exact = ar["spacing"], ar["bf16_terms_exact_mean"]
    stall = ar["by_hand_bf16_mean"] * ar["tokens"]
    return {"torch_off": abs(ar["bf16_mean"] - exact) / spacing,
            "by_hand_off": abs(ar["by_hand_bf16_mean"] - exact) / spacing,
            "stall": stall, "stall_spacing": 2 ** (math.floor(math.log2(stall)) - 7)}


def _kib(n) -> str:
    return f"{n / 2**10:.0f} KiB"


def bullets(on: dict, off: dict, meta: dict, bf16: dict, lg: dict, ar: dict, rd: dict, hsdp: dict) -> str:
    s = running_sums(ar)
    return "\n".join([
        f"* **Reshard on** (ZeRO-3): {on['fwd_all_gather']} all-gathers in forward, {on['bwd_all_gather']} "
        f"again in backward, {on['bwd_reduce_scatter']} reduce-scatters. **Reshard off**: "
        f"{off['bwd_all_gather']} all-gathers in backward, {_kib(off['kept_after_forward'])} of full "
        f"parameters kept from forward to backward.",
        f"* **Meta-device init**, {meta['params']:,d} parameters ({meta['full_mib']} MiB): peak "
        f"{meta['normal_peak_mib']} MiB per rank built normally, {meta['meta_peak_mib']} MiB on the meta "
        f"device (shards {meta['shard_mib']} MiB, largest tensor {meta['largest_tensor_mib']:.2f} MiB: at most "
        f"{float(meta['shard_mib']) + 2 * float(meta['largest_tensor_mib']):.2f} MiB, the shards and two copies of it).",
        f"* **bf16**: all-gathers carry {_kib(bf16['bf16_all_gather'])} instead of "
        f"{_kib(bf16['fp32_all_gather'])}; reduce-scatters {_kib(bf16['bf16_reduce_scatter'])} either way. "
        f"Loss ({bf16['loss_dtype']}) {bf16['bf16_loss']:.6f} against {bf16['fp32_loss']:.6f} in fp32 "
        f"({abs(bf16['bf16_loss'] - bf16['fp32_loss']):.1e} apart: the blocks computed in bf16). Shards stay "
        f"{bf16['shard_dtype']}.",
        f"* **Logits under the policy** (rank 0's {lg['tokens']:,d} tokens): dtype {lg['bf16_logits_dtype']}, "
        f"each value a bf16 number; the gradient into the head (its output's) arrived in "
        f"{lg['bf16_head_grad_dtype']}: exactly the logits' fp32 gradient rounded (the cast's backward). Against "
        f"the fp32 model, norm-wise: logits 2^-{lg['bf16_logit_bits']:.1f}, per-token losses "
        f"2^-{lg['bf16_loss_bits']:.1f}, the gradient into the head 2^-{lg['bf16_grad_bits']:.1f}. **Head in "
        f"fp32**: logits no longer bf16 numbers, the gradient into the head {lg['fp32_head_head_grad_dtype']} and 2^-{lg['fp32_head_grad_bits']:.1f} off, the logits still "
        f"2^-{lg['fp32_head_logit_bits']:.1f} off (the blocks computed in bf16), the losses "
        f"2^-{lg['fp32_head_loss_bits']:.1f}.",
        f"* **What `output_dtype` changes**: the policy's logits through `F.cross_entropy` in bf16 give "
        f"per-token losses 2^-{ar['ce_bits']:.1f} off those in fp32 from the same logits. torch's bf16 mean "
        f"{ar['bf16_mean']:.6f} against {ar['bf16_terms_exact_mean']:.6f}, the exact mean of the same bf16 "
        f"losses ({s['torch_off']:.1f} bf16 spacings of {ar['spacing']} off; in fp32 {ar['fp32_mean']:.6f}). "
        f"Added one by one into a bf16 number they end at {ar['by_hand_bf16_mean']:.6f} "
        f"({s['by_hand_off']:.0f} spacings off): {ar['lost']:,d} of the {ar['tokens']:,d} additions left it "
        f"unchanged, since it stops at {s['stall']:.0f}, where bf16 numbers are {s['stall_spacing']:.0f} apart.",
        f"* **A logit's rounding** (the fp32 model's logits rounded to bf16, the loss from each): each token's "
        f"loss moves by at most {rd['err_over_bound_max_at_model']:.2f} of its bound (1-p)(e^(2d)-1), "
        f"d = max|z|·2^-8 ({rd['err_over_first_order_max_at_model']:.2f} of the first-order 2(1-p)·d). Here "
        f"(largest {rd['top_mean_at_model']:.2f} on average, median loss {rd['loss_median_at_model']:.2f}) that "
        f"is {rd['rel_err_median_at_model']:.1e} of the loss at the median; at a trained model's size (largest "
        f"{rd['top_mean_at_trained']:.0f} on average, up to {rd['top_max_at_trained']:.0f}; median loss "
        f"{rd['loss_median_at_trained']:.2f}) at most {rd['err_over_bound_max_at_trained']:.2f} of the bound "
        f"(which allows up to {rd['second_order_max_at_trained']:.0%} over first order there), "
        f"{rd['rel_err_median_at_trained']:.1%} of the loss at the median and up to "
        f"{rd['rel_err_max_at_trained']:.1%}: more than bf16's own rounding of a number (up to "
        f"2^-8 = {2 ** -8:.2%}), fewer than 8 correct bits left in the median confident token's loss.",
        f"* **HSDP** (replicate 2, shard 2): placements `{hsdp['placements']}`, {hsdp['local_fraction']:.0%} "
        f"of the parameters per rank, replicas equal after a step; collectives {hsdp['calls']}."])
