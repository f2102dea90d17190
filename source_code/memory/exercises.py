"""Exercise of notebook 08: the peak memory of a training step, predicted from its configuration.

    from source_code.memory.exercises import check_predict_peak_bytes
    print(check_predict_peak_bytes(predict_peak_bytes))

The learner writes ``predict_peak_bytes(cfg)``, ``cfg`` a dict with ``n_params``, ``vocab``,
``hidden``, ``layers``, ``heads``, ``batch``, ``seq`` and ``precision``: "fp32" (AdamW on fp32
weights) or "bf16-mixed" (a bf16 model, AdamW on fp32 master weights, bf16 gradients). It
returns the bytes one process holds at the peak of the forward and backward of a training step
from the second step on (the optimizer state exists, the gradients stay allocated:
``zero_grad(set_to_none=False)``).

The check draws configurations of its own (``draw``: both precisions, some where the state
dominates, some where the activations do), runs each step (``measure_peak``) and counts the
parameters, gradients and optimizer state from their tensors, the activations with
saved-tensor hooks, and the peak as those tensors plus the most a forward + backward allocated
at once (live.LiveBytes: the activations and backward's transients). A prediction within
``TOLERANCE`` of every measured peak is correct. Otherwise the verdict is one line: the wrong
model that explains the answer on every configuration (``WRONG_MODELS``, for the tests), or the
configuration furthest off. The check never raises: a learner's exception becomes its line too.
"""
from __future__ import annotations

import functools
import random
import sys

import torch
import torch.nn.functional as F

from source_code.measure import optimizer_tensors, tensor_bytes
from source_code.memory import calculator, formula, recompute
from source_code.memory.live import LiveBytes
from source_code.memory.saved import saved_bytes
from source_code.models import TransformerLM

PRECISIONS = ("fp32", "bf16-mixed")
TOLERANCE = 0.10
MIB = 2 ** 20


def draw(seed: int = 8, n: int = 6) -> list[dict]:
    """``n`` configurations, fp32 and bf16-mixed in pairs, each pair one short and wide (the
    state dominates) and one long and narrow (the activations do)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        heavy_state = i % 2 == 0
        hidden = rng.choice((96, 128) if heavy_state else (32, 48, 64))
        heads = rng.choice([a for a in (2, 4, 8) if hidden % a == 0 and hidden // a >= 8])
        out.append({"vocab": rng.randint(16, 64), "hidden": hidden, "heads": heads,
                    "layers": rng.randint(2, 3), "batch": rng.randint(1, 2) if heavy_state else rng.randint(3, 4),
                    "seq": rng.randint(8, 16) if heavy_state else rng.randint(32, 48),
                    "precision": PRECISIONS[(i // 2) % 2]})
    return out


def _key(cfg: dict) -> tuple:
    return tuple(cfg[k] for k in ("vocab", "hidden", "heads", "layers", "batch", "seq", "precision"))


@functools.lru_cache(maxsize=64)
def _measured(key: tuple, seed: int) -> dict:
    vocab, hidden, heads, layers, batch, seq, precision = key
    torch.manual_seed(seed)
    model = TransformerLM(vocab_size=vocab, dim=hidden, n_layers=layers, n_heads=heads, max_len=seq)
    bf16 = precision == "bf16-mixed"
    if bf16:
        model = model.to(torch.bfloat16)
    params = list(model.parameters())
    master = [p.detach().float().requires_grad_() for p in params] if bf16 else params
    opt = torch.optim.AdamW(master, lr=1e-3)
    x, y = recompute.random_tokens(model, batch, seq)

    def loss():
        return F.cross_entropy(model(x).float().flatten(0, 1), y.flatten())   # the loss in fp32
    loss().backward()                                         # step 1 creates the AdamW state
    if bf16:
        for p, m in zip(params, master):
            m.grad = p.grad.float()
    opt.step()
    if bf16:
        for p, m in zip(params, master):
            m.grad = None
            p.data.copy_(m.detach())
    for p in params:
        p.grad.zero_()                                        # gradients stay allocated
    held = {"params": tensor_bytes(params), "grads": tensor_bytes([p.grad for p in params]),
            "optimizer": tensor_bytes((master if bf16 else []) + [t for t in optimizer_tensors(opt) if t.dim()])}
    with LiveBytes() as live:
        loss().backward()
    held["activations"] = saved_bytes(loss, params)
    held["peak"] = held["params"] + held["grads"] + held["optimizer"] + live.peak
    held["n_params"] = sum(p.numel() for p in params)
    return held


def measure_peak(cfg: dict, seed: int = 0) -> dict:
    """{"n_params", "params", "grads", "optimizer", "activations", "peak"} of step 2 of ``cfg``, in bytes."""
    if cfg.get("precision") not in PRECISIONS:
        raise ValueError(f"precision {cfg.get('precision')!r}: choose one of {', '.join(PRECISIONS)}")
    if cfg["hidden"] % cfg["heads"]:
        raise ValueError(f"hidden {cfg['hidden']} is not divisible by heads {cfg['heads']}")
    if min(cfg[k] for k in ("vocab", "hidden", "heads", "layers", "batch", "seq")) < 1:
        raise ValueError(f"{cfg}: every size must be at least 1")
    return dict(_measured(_key(cfg), seed))


def _activations(cfg: dict, mode: str) -> float:
    return formula.model_activation_bytes(cfg["batch"], cfg["seq"], cfg["hidden"], cfg["layers"],
                                          cfg["heads"], cfg["vocab"], mode=mode)["total"]


def _parts(cfg: dict, m: dict) -> float:
    return m["params"] + m["grads"] + m["optimizer"] + m["activations"]


# (what the answer got wrong, its bytes from the counted parts): tried in this order
WRONG_MODELS = [
    ("the activations are missing: add what autograd keeps for backward, per token and block, "
     "and after the blocks", lambda c, m: _parts(c, m) - m["activations"]),
    ("the optimizer state is missing: AdamW keeps two moments per parameter (and, in bf16-mixed, "
     "an fp32 master copy of the weights)", lambda c, m: _parts(c, m) - m["optimizer"]),
    ("in bf16-mixed the optimizer also keeps the fp32 master copy of every weight (4 bytes a "
     "parameter, besides the two fp32 moments)",
     lambda c, m: _parts(c, m) - (4 * m["n_params"] if c["precision"] == "bf16-mixed" else 0)),
    ("bf16-mixed keeps its weights and gradients in bf16, 2 bytes each (the fp32 copy is the "
     "optimizer's)", lambda c, m: _parts(c, m) + (m["params"] + m["grads"] if c["precision"] == "bf16-mixed" else 0)),
    ("fp32 weights and gradients are 4 bytes each", lambda c, m: _parts(c, m) - (
        (m["params"] + m["grads"]) / 2 if c["precision"] == "fp32" else 0)),
    ("one of the weights or the gradients is missing (each is n_params values of the model's dtype)",
     lambda c, m: _parts(c, m) - m["grads"]),
    ("the weights or the gradients are counted twice", lambda c, m: _parts(c, m) + m["grads"]),
    ("the optimizer state is counted twice (AdamW keeps two moments, not four)",
     lambda c, m: _parts(c, m) + m["optimizer"]),
    ("in bf16-mixed the model computes in bf16: its activations are 2 bytes a value (the "
     "log-sum-exp and the log-softmax stay fp32)",
     lambda c, m: _parts(c, m) + (_activations(c, "fp32") - m["activations"] if c["precision"] == "bf16-mixed" else 0)),
    ("in fp32 every activation is 4 bytes a value",
     lambda c, m: _parts(c, m) + (_activations(c, "bf16") - m["activations"] if c["precision"] == "fp32" else 0)),
    ("the bytes per value look halved everywhere: fp32 values are 4 bytes, bf16 ones 2",
     lambda c, m: _parts(c, m) / 2),
]


def _describe(cfg: dict) -> str:
    return " ".join(f"{k}={cfg[k]}" for k in ("precision", "batch", "seq", "hidden", "layers", "heads", "vocab"))


class _Forbidden:
    """Notices, while the learner's function runs, a call into the calculator or the formula
    (the tools that already know the answer)."""

    def __init__(self):
        self.codes = {f.__code__ for f in (calculator.training_memory, calculator.state_bytes,
                                           formula.model_activation_bytes, formula.block_bytes_per_token)}
        self.used = None

    def _profile(self, frame, event, arg):
        if event == "call" and frame.f_code in self.codes and self.used is None:
            self.used = frame.f_code.co_name

    def __enter__(self):
        self._previous = sys.getprofile()
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc):
        sys.setprofile(self._previous)
        return False


def check_predict_peak_bytes(predict, seed: int = 8) -> str:
    """One line: 'correct: ...', or what is missing or wrong, or why the function did not run."""
    configs = draw(seed)
    got, measured = [], []
    for cfg in configs:
        m = measure_peak(cfg)
        c = {**cfg, "n_params": m["n_params"]}
        try:
            with _Forbidden() as guard:
                value = predict(dict(c))
        except NotImplementedError:
            return "not done yet: fill in predict_peak_bytes (replace the raise), then run the cell again"
        except Exception as exc:                                    # the learner's bug, in one line
            return f"your function raised {type(exc).__name__}: {exc} (on {_describe(c)})"
        if guard.used:
            return (f"not yet: predict from the parts you counted, without {guard.used} "
                    "(the calculator is what this exercise rebuilds)")
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value:
            return f"your function returned {value!r}: return a number of bytes"
        got.append(float(value))
        measured.append((c, m))
    errors = [(g - m["peak"]) / m["peak"] for g, (_, m) in zip(got, measured)]
    if all(abs(e) <= TOLERANCE for e in errors):
        return (f"correct: within {max(abs(e) for e in errors):.1%} of the measured peak on "
                f"{len(configs)} configurations (fp32 and bf16-mixed); the rest is backward's transients")
    for why, model in WRONG_MODELS:
        if all(abs(g - model(c, m)) <= TOLERANCE * m["peak"] for g, (c, m) in zip(got, measured)):
            return f"not yet: {why}"
    worst = max(range(len(errors)), key=lambda i: abs(errors[i]))
    c = measured[worst][0]
    return (f"not yet: on {_describe(c)} the prediction is {got[worst] / measured[worst][1]['peak']:.2f} "
            f"times the measured peak; list the four parts and the bytes of each value in this precision")
