"""Activation recomputation (checkpointing): keep less for backward, compute the forward again.

    python -m source_code.memory.report      # prints the ratio of peaks, full vs none

Three ways to run the blocks of a TransformerLM (``run_blocks``):

* ``none``: every block saves what its backward needs (formula.block_terms, 16h + 4 + a
  values a token in fp32);
* ``full``: ``torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)`` keeps only
  the block's input; its backward runs the block's forward again first, so one block's
  activations exist again, one block at a time. Cost: one more forward of every block;
* ``selective``: the same, with a policy that keeps the outputs of the expensive operations
  (matrix multiplications and the attention kernel, ``SAVE``) and recomputes the cheap ones
  (LayerNorms, GELU, additions, casts). The rule that picks which: store what costs many FLOPs
  per byte to make again (a matmul: 2h FLOPs per value it outputs), recompute what costs few
  (an elementwise op: a few FLOPs per value). In a Megatron block without a flash kernel the
  attention's s x s scores and softmax are the cheap-to-recompute, expensive-to-store part
  (Korthikanti et al.'s selective recomputation); a flash kernel never stores them.

``measure`` counts, for each way, the bytes still allocated after the forward and the peak of
a whole forward + backward (live.LiveBytes, parameters and gradients allocated beforehand and
not counted), and times steps of the three interleaved.
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from source_code.memory.live import LiveBytes

MODES = ("none", "full", "selective")
aten = torch.ops.aten
# the expensive operations a selective policy keeps (names that this torch does not have are skipped)
SAVE = {getattr(aten, name).default for name in (
    "mm", "addmm", "bmm", "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention") if hasattr(aten, name)}


def _policy(ctx, op, *args, **kwargs):
    from torch.utils.checkpoint import CheckpointPolicy
    return CheckpointPolicy.MUST_SAVE if op in SAVE else CheckpointPolicy.PREFER_RECOMPUTE


def selective_context():
    from torch.utils.checkpoint import create_selective_checkpoint_contexts
    return create_selective_checkpoint_contexts(_policy)


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


def _batch(model, batch: int, seq: int, device, seed: int = 0):
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


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def step_times(model, x, y, modes=MODES, repeats: int = 5) -> dict:
    """Median seconds of a forward + backward per mode, the modes interleaved in each round."""
    times = {m: [] for m in modes}
    for r in range(repeats + 1):                  # round 0 warms up
        for m in modes:
            _sync(x.device)
            t0 = time.perf_counter()
            loss_of(model, x, y, m).backward()
            _sync(x.device)
            if r:
                times[m].append(time.perf_counter() - t0)
    return {m: statistics.median(v) for m, v in times.items()}


def measure(model, batch: int, seq: int, repeats: int = 5, modes=MODES) -> dict:
    """Per mode: bytes after forward, peak bytes of the step, median step seconds; plus ratios."""
    device = next(model.parameters()).device
    x, y = _batch(model, batch, seq, device)
    out = {m: memory_of(model, x, y, m) for m in modes}
    for m, t in step_times(model, x, y, modes, repeats).items():
        out[m]["seconds"] = t
    for m in modes:
        out[m]["peak_ratio"] = out[m]["peak"] / out["none"]["peak"]
        out[m]["time_ratio"] = out[m]["seconds"] / out["none"]["seconds"]
    model.zero_grad(set_to_none=True)
    return out


def same_gradients(model, batch: int = 2, seq: int = 16, modes=MODES) -> float:
    """Largest |gradient difference| of full and selective recomputation from none (recomputing
    runs the same operations on the same inputs: 0 on the CPU)."""
    device = next(model.parameters()).device
    x, y = _batch(model, batch, seq, device, seed=1)
    grads = {}
    for m in modes:
        model.zero_grad(set_to_none=True)
        loss_of(model, x, y, m).backward()
        grads[m] = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return max((a - b).abs().max().item() for m in modes for a, b in zip(grads[m], grads["none"]))

