"""Activation recomputation (checkpointing): keep less for backward, compute the forward again.

    python -m source_code.memory.report                     # prints the ratio of peaks, full vs none
    python -m source_code.memory.report --attention math    # a non-fused attention: the s x s scores

Three ways to run the blocks of a TransformerLM (``run_blocks``):

* ``none``: every block saves what its backward needs (formula.block_terms, 16h + 4 + a
  values a token in fp32 with a fused attention kernel);
* ``full``: ``torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)`` keeps only
  the block's input; its backward runs the block's forward again first, so one block's
  activations exist again, one block at a time. Cost: one more forward of every block;
* ``selective``: the same, with a policy that keeps the outputs that are expensive to make
  again for their size and recomputes the rest. A linear layer's matmul (``mm``, ``addmm``)
  spends 2h FLOPs on each value it outputs, a fused attention kernel 4s: kept (``SAVE``).
  Everything else is recomputed: LayerNorm, GELU, additions (a few FLOPs a value) and, in an
  attention that is not fused, its batched matmuls, mask and softmax, which fill a x s x s
  values a sequence at 2 h/a FLOPs a value or fewer (Korthikanti et al. 2022's selective
  recomputation: the s x s part is the large, cheap one).

``attention``: "flash" (``scaled_dot_product_attention`` picks a fused kernel, which never
stores the s x s scores) or "math" (the same call forced to the unfused composite:
``torch.nn.attention.sdpa_kernel(SDPBackend.MATH)``), for forward and backward alike.

``measure`` counts, for each way, the bytes still allocated after the forward and the peak of
a whole forward + backward (live.LiveBytes, parameters and gradients allocated beforehand and
not counted), the matmul FLOPs of a step (``torch.utils.flop_counter``: what recomputing
adds is deterministic) and times steps of the three interleaved (measure.clock).
"""
from __future__ import annotations

import contextlib
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from source_code.measure import clock
from source_code.memory.live import LiveBytes

MODES = ("none", "full", "selective")
ATTENTION = {"flash": None, "math": SDPBackend.MATH}
aten = torch.ops.aten
# the expensive operations a selective policy keeps (names that this torch does not have are skipped)
SAVE = {getattr(aten, name).default for name in (
    "mm", "addmm", "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention") if hasattr(aten, name)}


def policy(ctx, op, *args, **kwargs):
    """Selective recomputation's rule, asked for every operation inside a checkpointed block."""
    from torch.utils.checkpoint import CheckpointPolicy
    return CheckpointPolicy.MUST_SAVE if op in SAVE else CheckpointPolicy.PREFER_RECOMPUTE


def selective_context():
    from torch.utils.checkpoint import create_selective_checkpoint_contexts
    return create_selective_checkpoint_contexts(policy)


def run_blocks(model, h: torch.Tensor, mode: str = "none") -> torch.Tensor:
    """The blocks of ``model`` on h (batch, seq, hidden), each checkpointed as ``mode`` says."""
    if mode not in MODES:
        raise ValueError(f"unknown recomputation {mode!r}; choose one of {', '.join(MODES)}")
    for block in model.layers:
        if mode == "none":
            h = block(h)
        elif mode == "full":
            h = checkpoint(block, h, use_reentrant=False)
        else:
            h = checkpoint(block, h, use_reentrant=False, context_fn=selective_context)
    return h


def loss_of(model, x: torch.Tensor, y: torch.Tensor, mode: str = "none") -> torch.Tensor:
    """TransformerLM's forward with the blocks run as ``mode`` says, cross-entropy in fp32."""
    pos = torch.arange(x.shape[1], device=x.device)
    h = run_blocks(model, model.tok(x) + model.pos(pos), mode)
    logits = model.head(model.norm(h))
    return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())


def attention_kernel(attention: str = "flash"):
    """Context for forward and backward (a checkpoint recomputes inside backward): "flash" lets
    scaled_dot_product_attention choose its fused kernel, "math" forces the unfused one."""
    if attention not in ATTENTION:
        raise ValueError(f"unknown attention {attention!r}; choose one of {', '.join(ATTENTION)}")
    backend = ATTENTION[attention]
    return contextlib.nullcontext() if backend is None else sdpa_kernel(backend)


def random_tokens(model, batch: int, seq: int, device="cpu", seed: int = 0):
    """(inputs, targets): ``batch`` random sequences of ``seq`` tokens of the model's vocabulary."""
    if batch < 1 or seq < 1:
        raise ValueError(f"batch={batch}, seq={seq}: both must be at least 1")
    if seq > model.pos.num_embeddings:
        raise ValueError(f"seq={seq} exceeds the model's max_len {model.pos.num_embeddings}; "
                         f"build TransformerLM(max_len={seq}) or shorten the sequences")
    g = torch.Generator().manual_seed(seed)
    vocab = model.tok.num_embeddings
    return (torch.randint(0, vocab, (batch, seq), generator=g).to(device),
            torch.randint(0, vocab, (batch, seq), generator=g).to(device))


def memory_of(model, x, y, mode: str) -> dict:
    """{"after_forward", "peak"}: bytes allocated during one step, beyond parameters and gradients."""
    for p in model.parameters():                  # gradients exist already, as from step 2 on
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    with LiveBytes() as live:
        loss = loss_of(model, x, y, mode)
        after = live.now
        loss.backward()
        del loss
    return {"after_forward": after, "peak": live.peak}


def _flash_cpu(q, k, v, *args, out_shape=None, **kwargs):
    return sdpa_flop_count(q, k, v)


def _flash_cpu_backward(grad, q, k, v, *args, out_shape=None, **kwargs):
    return sdpa_backward_flop_count(grad, q, k, v)


# the CPU's fused attention kernel, counted as torch counts the GPU's (full s x s, mask or not)
_CPU_FLASH = {getattr(aten, k): f for k, f in (
    ("_scaled_dot_product_flash_attention_for_cpu", _flash_cpu),
    ("_scaled_dot_product_flash_attention_for_cpu_backward", _flash_cpu_backward)) if hasattr(aten, k)}


def step_flops(model, x, y, mode: str) -> int:
    """Matmul and attention-kernel FLOPs of one forward + backward (recomputation included)."""
    with FlopCounterMode(display=False, custom_mapping=_CPU_FLASH) as counter:
        loss_of(model, x, y, mode).backward()
    return counter.get_total_flops()


def step_times(model, x, y, modes=MODES, repeats: int = 5) -> dict:
    """Median seconds of a forward + backward per mode, the modes interleaved in each round."""
    times = {m: [] for m in modes}
    for r in range(repeats + 1):                  # round 0 warms up
        for m in modes:
            t0 = clock(x.device)
            loss_of(model, x, y, m).backward()
            if r:
                times[m].append(clock(x.device) - t0)
    return {m: statistics.median(v) for m, v in times.items()}


def measure(model, batch: int, seq: int, repeats: int = 5, modes=MODES, attention: str = "flash") -> dict:
    """Per mode: bytes after forward, peak bytes of the step, FLOPs and median seconds of a step;
    ratios to "none" (which ``modes`` must hold)."""
    if "none" not in modes or set(modes) - set(MODES):
        raise ValueError(f"modes {modes}: choose among {', '.join(MODES)}, with 'none' as the reference")
    if repeats < 1:
        raise ValueError(f"repeats={repeats}: time at least one step per mode")
    device = next(model.parameters()).device
    x, y = random_tokens(model, batch, seq, device)
    with attention_kernel(attention):
        out = {m: memory_of(model, x, y, m) for m in modes}
        for m in modes:
            out[m]["flops"] = step_flops(model, x, y, m)
        for m, t in step_times(model, x, y, modes, repeats).items():
            out[m]["seconds"] = t
    for m in modes:
        out[m]["peak_ratio"] = out[m]["peak"] / out["none"]["peak"]
        out[m]["time_ratio"] = out[m]["seconds"] / out["none"]["seconds"]
        out[m]["flops_ratio"] = out[m]["flops"] / out["none"]["flops"]
    model.zero_grad(set_to_none=True)
    return out


def same_gradients(model, batch: int = 2, seq: int = 16, modes=MODES, attention: str = "flash") -> float:
    """Largest |gradient difference| of full and selective recomputation from none (recomputing
    runs the same operations on the same inputs: 0 on the CPU)."""
    device = next(model.parameters()).device
    x, y = random_tokens(model, batch, seq, device, seed=1)
    grads = {}
    with attention_kernel(attention):
        for m in modes:
            model.zero_grad(set_to_none=True)
            loss_of(model, x, y, m).backward()
            grads[m] = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return max((a - b).abs().max().item() for m in modes for a, b in zip(grads[m], grads["none"]))
