"""Exercise of notebook 08: predict the peak memory of a training step, then measure it.

    from source_code.memory.exercises import EXERCISE, measure_peak, check_predict_peak_bytes
    check_predict_peak_bytes(predict_peak_bytes, measure_peak())

The learner writes ``predict_peak_bytes(n_params, layers, hidden, heads, vocab, batch, seq)``:
the bytes one process holds at the peak of a training step of the TransformerLM ``EXERCISE``
describes, in fp32 with AdamW, from the second step on (the optimizer state exists, the
gradients are kept: ``zero_grad(set_to_none=False)``). ``measure_peak`` runs that step and
counts: parameters, gradients and optimizer state from their tensors, plus the peak of what the
step allocates (live.LiveBytes), which is the activations plus a few transients (gradients of
activations, a weight's gradient before it is added into ``.grad``). The check accepts a
prediction within ``TOLERANCE`` of the measured peak, and otherwise names the term a wrong
answer missed or counted twice (each term is at least 18 % of the total, so one is never
inside the tolerance).
"""
from __future__ import annotations

import torch

from source_code.memory import recompute
from source_code.memory.live import LiveBytes
from source_code.memory.saved import saved_bytes
from source_code.models import TransformerLM
from source_code.measure import optimizer_tensors, tensor_bytes

EXERCISE = {"vocab": 32, "hidden": 128, "layers": 2, "heads": 4, "batch": 4, "seq": 32}
TOLERANCE = 0.10


def measure_peak(spec: dict | None = None, seed: int = 0) -> dict:
    """{"n_params", "params", "grads", "optimizer", "activations", "peak"} of step 2, in bytes."""
    e = {**EXERCISE, **(spec or {})}
    torch.manual_seed(seed)
    model = TransformerLM(vocab_size=e["vocab"], dim=e["hidden"], n_layers=e["layers"],
                          n_heads=e["heads"], max_len=e["seq"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = recompute._batch(model, e["batch"], e["seq"], "cpu")
    recompute.loss_of(model, x, y).backward()                 # step 1 creates the AdamW state
    opt.step()
    opt.zero_grad(set_to_none=False)                          # gradients stay allocated
    params = list(model.parameters())
    held = {"params": tensor_bytes(params), "grads": tensor_bytes([p.grad for p in params]),
            "optimizer": tensor_bytes(optimizer_tensors(opt))}
    with LiveBytes() as live:
        recompute.loss_of(model, x, y).backward()
    held["activations"] = saved_bytes(lambda: recompute.loss_of(model, x, y), params)
    held["peak"] = held["params"] + held["grads"] + held["optimizer"] + live.peak
    held["n_params"] = sum(p.numel() for p in params)
    return held


def _diagnose(got: float, measured: dict) -> str:
    """The term whose absence (or double count) explains the miss best: compared with the sum
    of the four counted terms (the peak adds transients on top)."""
    peak = sum(measured[t] for t in ("params", "grads", "optimizer", "activations"))
    guesses = []
    for term in ("params", "grads", "optimizer", "activations"):
        b = measured[term]
        guesses.append((abs(got - (peak - b)), term, b, "lacks"))
        guesses.append((abs(got - (peak + b)), term, b, "counts twice"))
    off, term, b, how = min(guesses)
    if off <= TOLERANCE * peak:
        same = [t for _, t, v, h in guesses if h == how and v == b]    # params and grads: equal bytes
        return f"it {how} the {' or the '.join(same)} ({b / 2**20:.2f} MiB{' each' if len(same) > 1 else ''})"
    if abs(got - peak / 2) <= TOLERANCE * peak or abs(got - peak / 4) <= TOLERANCE * peak:
        return "are the bytes per value right? fp32 is 4 bytes"
    return ("list the four parts: parameters, gradients, AdamW's two moments, and what "
            "autograd saves in each block per token")


def check_predict_peak_bytes(predict, measured: dict | None = None) -> str:
    """'correct: ...' or an AssertionError naming the term that is missing or doubled."""
    measured = measured or measure_peak()
    e = EXERCISE
    try:
        got = predict(measured["n_params"], e["layers"], e["hidden"], e["heads"], e["vocab"],
                      e["batch"], e["seq"])
    except NotImplementedError:
        raise NotImplementedError("exercise not done yet: fill in predict_peak_bytes") from None
    peak = measured["peak"]
    error = (got - peak) / peak
    if abs(error) > TOLERANCE:
        raise AssertionError(f"predicted {got / 2**20:.2f} MiB, measured peak {peak / 2**20:.2f} MiB "
                             f"({error:+.0%}, more than {TOLERANCE:.0%} off): {_diagnose(got, measured)}")
    return (f"correct: predicted {got / 2**20:.2f} MiB, measured peak {peak / 2**20:.2f} MiB "
            f"({error:+.1%}, within {TOLERANCE:.0%}; the rest are transients of backward)")
