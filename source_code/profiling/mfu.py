"""Model FLOPs utilisation (MFU): the FLOPs a training step must do / step time / peak FLOP/s.

    python -m source_code.profiling.mfu                        # CPU, float32, small model
    python -m source_code.profiling.mfu --dim 2048 --layers 8 --seq 2048 --batch 8   # a GPU: bf16 + compile

For the TransformerLM of source_code/models.py (L blocks of width d, vocabulary V, a batch of
B sequences of T tokens), per training step (forward = 1x, backward = 2x the matmul work):

    matmul weights   N = L * 12 d^2 + d V        (q, k, v, o: 4 d^2; MLP up + down: 8 d^2; head)
    FLOPs/step       = 6 N (B T)  +  12 L B T^2 d
                       weights     attention scores Q K^T and weights x V (forward 4 B T^2 d
                                   per layer, times 3)

Embedding look-ups, norms, activations and the softmax are left out: they cost memory traffic,
not FLOPs, on any accelerator. The attention term counts the full T x T matrix, by convention,
although a causal kernel (FlashAttention) skips the masked half. The peak is MEASURED in the same
run (a large matmul: float32 on a CPU, bf16 on a GPU), not taken from a data sheet.
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

from source_code import models
from source_code.cli import Parser, positive_int
from source_code.errors import run_main


def matmul_weights(n_layers: int, dim: int, vocab: int) -> int:
    """Parameters that take part in matrix multiplications (no biases, norms or embeddings)."""
    return n_layers * 12 * dim * dim + dim * vocab


def transformer_flops(n_layers: int, dim: int, vocab: int, batch: int, seq: int) -> int:
    """Model FLOPs of one training step (forward + backward) of the TransformerLM."""
    tokens = batch * seq
    return 6 * matmul_weights(n_layers, dim, vocab) * tokens + 12 * n_layers * batch * seq * seq * dim


def model_shape(model: models.TransformerLM) -> dict:
    return {"n_layers": len(model.layers), "dim": model.tok.embedding_dim, "vocab": model.head.out_features}


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def matmul_peak(device="cpu", dtype=torch.float32, n: int | None = None, repeats: int = 5) -> float:
    """FLOP/s of the best of ``repeats`` n x n matmuls (2 n^3 FLOPs each) on ``device``."""
    n = n or (8192 if torch.device(device).type == "cuda" else 1024)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    a @ b  # first call: library start-up
    best = float("inf")
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        a @ b
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def step_time(model, batch: int, seq: int, device="cpu", bf16: bool = False, compile: bool = False,
              steps: int = 5, warmup: int = 2) -> float:
    """Median seconds of a full training step (forward, backward, AdamW) on random tokens."""
    vocab = model.head.out_features
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **({"fused": True} if torch.device(device).type == "cuda" else {}))
    fwd = torch.compile(model) if compile else model
    x = torch.randint(0, vocab, (batch, seq), device=device)
    y = torch.randint(0, vocab, (batch, seq), device=device)
    times = []
    for i in range(warmup + steps):
        sync(device)
        t0 = time.perf_counter()
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(fwd(x).flatten(0, 1).float(), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync(device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(dim: int = 256, layers: int = 4, seq: int = 128, batch: int = 8, vocab: int = 512,
            device="cpu", bf16: bool = False, compile: bool = False, steps: int = 5) -> dict:
    """MFU of a TransformerLM of this shape, with the peak measured right before the step."""
    torch.manual_seed(0)
    model = models.TransformerLM(vocab_size=vocab, dim=dim, n_layers=layers,
                                 n_heads=max(dim // 64, 1) if dim < 1024 else dim // 128,
                                 max_len=seq).to(device)
    flops = transformer_flops(layers, dim, vocab, batch, seq)
    peak = matmul_peak(device, torch.bfloat16 if bf16 else torch.float32)
    t = step_time(model, batch, seq, device, bf16, compile, steps)
    return {"params": models.count_parameters(model), "matmul_weights": matmul_weights(layers, dim, vocab),
            "flops_per_step": flops, "step_s": t, "achieved_flops": flops / t, "peak_flops": peak,
            "mfu": flops / t / peak, "shape": dict(dim=dim, layers=layers, seq=seq, batch=batch, vocab=vocab),
            "device": str(device), "dtype": "bf16" if bf16 else "float32", "compiled": compile}


def describe(r: dict) -> str:
    s = r["shape"]
    return (f"TransformerLM d={s['dim']} L={s['layers']} T={s['seq']} B={s['batch']} V={s['vocab']} "
            f"({r['params'] / 1e6:.1f} M parameters) on {r['device']}, {r['dtype']}"
            f"{', compiled' if r['compiled'] else ''}: {r['flops_per_step'] / 1e9:.1f} GFLOP per step in "
            f"{1e3 * r['step_s']:.1f} ms = {r['achieved_flops'] / 1e9:.1f} GFLOP/s; measured matmul peak "
            f"{r['peak_flops'] / 1e9:.1f} GFLOP/s; MFU {100 * r['mfu']:.1f} %")


def main(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--dim", type=positive_int, default=256)
    p.add_argument("--layers", type=positive_int, default=4)
    p.add_argument("--seq", type=positive_int, default=128)
    p.add_argument("--batch", type=positive_int, default=8)
    p.add_argument("--vocab", type=positive_int, default=512)
    p.add_argument("--threads", type=positive_int, default=1, help="CPU threads (peak and step alike)")
    args = p.parse_args(argv)
    gpu = torch.cuda.is_available()
    torch.set_num_threads(args.threads)
    r = measure(args.dim, args.layers, args.seq, args.batch, args.vocab,
                device="cuda" if gpu else "cpu", bf16=gpu, compile=gpu)
    print(describe(r))
    print(f"summary: mfu={r['mfu']:.4f} step_ms={1e3 * r['step_s']:.2f} peak_gflops={r['peak_flops'] / 1e9:.1f}")
    return 0


if __name__ == "__main__":
    run_main(main)
