"""Model FLOPs utilisation (MFU): the FLOPs a training step must do / step time / peak FLOP/s.

    python -m source_code.profiling.mfu                        # CPU, float32, small model
    python -m source_code.profiling.mfu --dim 2048 --layers 8 --seq 2048 --batch 8   # a GPU: bf16 + compile

For the TransformerLM of source_code/models.py (L blocks of width d, vocabulary V, a batch of
B sequences of T tokens), per training step (forward = 1x, backward = 2x the matmul work):

    matmul weights   N = L * 12 d^2 + d V        (q, k, v, o: 4 d^2; MLP up + down: 8 d^2; head)
    model FLOPs      = 6 N (B T)                 (model_flops: 6 N per token)
    attention FLOPs  = 12 L B T^2 d              (attention_flops: per layer the two matmuls
                       Q K^T and weights x V, forward 2 * 2 B T^2 d = 4 B T^2 d, times 3 with
                       the backward)
    FLOPs/step       = model FLOPs + attention FLOPs   (transformer_flops)

Embedding look-ups, norms, activations and the softmax are left out: they cost memory traffic,
not FLOPs, on any accelerator. The attention term counts the full T x T matrix, as torch's
FlopCounterMode and the published MFU formulas (PaLM, Megatron) do, although the causal mask
makes half of it unneeded and a causal FlashAttention kernel skips that half
(``attention_flops(..., causal_skip=True)``): MFU counts the FLOPs the model needs by a fixed
convention, not the ones a kernel happens to run. ``counted_flops`` checks both terms with
FlopCounterMode on any device.

Two peaks, two MFUs: published MFU divides by the DATASHEET peak of the GPU for the number
format used (``DATASHEET``: dense, no sparsity); ``measure`` also measures a peak in the same
run (a large matmul: float32 on a CPU, bf16 on a GPU) and reports MFU against both. A CPU has
no datasheet peak here: only the measured one. The workshop's goal of 40 % on one H100 is
against the datasheet bf16 peak of the H100 SXM.
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


def model_flops(n_layers: int, dim: int, vocab: int, batch: int, seq: int) -> int:
    """The weights' matmuls of one training step: 6 N per token (2 per multiply-add, forward + 2x backward)."""
    return 6 * matmul_weights(n_layers, dim, vocab) * batch * seq


def attention_flops(n_layers: int, dim: int, batch: int, seq: int, causal_skip: bool = False) -> int:
    """Q K^T and weights x V of one training step: 4 B T^2 d forward per layer, x3 with the
    backward; ``causal_skip``: halved, as a causal kernel that skips the masked half runs it."""
    full = 12 * n_layers * batch * seq * seq * dim
    return full // 2 if causal_skip else full


def transformer_flops(n_layers: int, dim: int, vocab: int, batch: int, seq: int) -> int:
    """FLOPs of one training step (forward + backward) of the TransformerLM: model + full attention."""
    return model_flops(n_layers, dim, vocab, batch, seq) + attention_flops(n_layers, dim, batch, seq)


ATTENTION_OPS = ("bmm", "scaled_dot_product")  # the TransformerLM's weights use mm/addmm only


def counted_flops(model, tokens) -> dict:
    """FlopCounterMode's count of a forward + backward, split into the weights' matmuls and
    attention. The math kernel of scaled_dot_product_attention is forced: its matmuls are
    counted on every device, where the default kernel is counted on some (CUDA's flash and
    efficient kernels: the full T x T) and not on others (the CPU's flash kernel: 0)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode
    with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
        model(tokens).float().sum().backward()
    per_op = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    attention = sum(n for op, n in per_op.items() if any(a in op for a in ATTENTION_OPS))
    return {"total": counter.get_total_flops(), "attention": attention,
            "weights": counter.get_total_flops() - attention, "per_op": per_op}


# Dense (no sparsity) peak FLOP/s per number format, from the vendors' data sheets. TF32 is
# NVIDIA's tensor-core format for float32 matmuls (fp32 range, 10-bit mantissa), used only where
# torch allows it (torch.backends.cuda.matmul.allow_tf32 / set_float32_matmul_precision("high"));
# without it float32 runs at the "fp32" rate. CDNA2 (MI250X) has no TF32; its fp32 figure is the
# matrix cores' (the vector units: half). An MI250X is two GCDs, each one device to torch.
DATASHEET = {
    "H100 SXM": {"bf16": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12},
    "A100": {"bf16": 312e12, "tf32": 156e12, "fp32": 19.5e12},
    "MI250X GCD": {"bf16": 191.5e12, "tf32": None, "fp32": 47.9e12},
}
# torch.cuda.get_device_name() -> DATASHEET row. The H200 is the H100 SXM's chip with more and
# faster memory (141 GB HBM3e): its data sheet lists the same dense peaks, so it shares the row.
DEVICE_NAMES = (("H100 80GB HBM3", "H100 SXM"), ("H100 SXM", "H100 SXM"), ("H200", "H100 SXM"),
                ("A100", "A100"), ("MI250X", "MI250X GCD"))
GOAL = {"gpu": "H100 SXM", "format": "bf16", "mfu": 0.40}  # the workshop's MFU goal on one H100


def datasheet_row(device_name: str) -> str | None:
    """The DATASHEET row of a device name as torch gives it, or None (a CPU, an unlisted GPU)."""
    return next((row for pattern, row in DEVICE_NAMES if pattern in device_name), None)


def number_format(device, bf16: bool) -> str:
    """The datasheet column a step runs at: bf16 under autocast, else tf32 where CUDA allows it."""
    if bf16:
        return "bf16"
    return "tf32" if torch.device(device).type == "cuda" and torch.backends.cuda.matmul.allow_tf32 else "fp32"


def datasheet_peak(device, bf16: bool) -> tuple[str | None, float | None]:
    """(row, peak FLOP/s) from DATASHEET for this device and format; (None, None) where none exists."""
    if torch.device(device).type != "cuda":
        return None, None
    row = datasheet_row(torch.cuda.get_device_name(torch.device(device)))
    return row, (DATASHEET[row][number_format(device, bf16)] if row else None)


def model_shape(model: models.TransformerLM) -> dict:
    return {"n_layers": len(model.layers), "dim": model.tok.embedding_dim, "vocab": model.head.out_features}


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def clock(device="cpu"):
    """The clock a measurement here reads: on a CPU with one compute thread, the CPU time of the
    calling thread (the computation runs on it: what other processes on the machine do, taking
    the core away, does not count); elsewhere, the wall clock (a GPU's kernels, or several
    threads, run outside this thread)."""
    if torch.device(device).type == "cpu" and torch.get_num_threads() == 1:
        return time.thread_time
    return time.perf_counter


def matmul_peak(device="cpu", dtype=torch.float32, n: int | None = None, repeats: int = 5) -> float:
    """FLOP/s of the best of ``repeats`` n x n matmuls (2 n^3 FLOPs each) on ``device``."""
    n = n or (8192 if torch.device(device).type == "cuda" else 1024)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    a @ b  # first call: library start-up
    best, now = float("inf"), clock(device)
    for _ in range(repeats):
        sync(device)
        t0 = now()
        a @ b
        sync(device)
        best = min(best, now() - t0)
    return 2 * n**3 / best


def step_time(model, batch: int, seq: int, device="cpu", bf16: bool = False, compile: bool = False,
              steps: int = 5, warmup: int = 2, all_steps: bool = False, before_each=None):
    """Median seconds of a full training step (forward, backward, AdamW) on random tokens
    (``all_steps``: the list of every timed step). ``before_each()`` runs, untimed, before each
    timed step."""
    vocab = model.head.out_features
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **({"fused": True} if torch.device(device).type == "cuda" else {}))
    fwd = torch.compile(model) if compile else model
    x = torch.randint(0, vocab, (batch, seq), device=device)
    y = torch.randint(0, vocab, (batch, seq), device=device)
    times, now = [], clock(device)
    for i in range(warmup + steps):
        if i >= warmup and before_each is not None:
            before_each()
        sync(device)
        t0 = now()
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(fwd(x).flatten(0, 1).float(), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync(device)
        if i >= warmup:
            times.append(now() - t0)
    return times if all_steps else statistics.median(times)


def measure(dim: int = 256, layers: int = 4, seq: int = 128, batch: int = 8, vocab: int = 512,
            device="cpu", bf16: bool = False, compile: bool = False, steps: int = 5) -> dict:
    """MFU of a TransformerLM of this shape: a peak matmul measured right before each step, and
    MFU the fastest step's FLOP/s over the fastest matmul's. A busy machine only slows both (a
    step or a matmul that shares its core with another process), so the least disturbed of each
    is the closest to what this machine does: a median step beside a median matmul still moved
    with the load (the narrow model came out ahead of the wide one beside a cluster's jobs). On a
    CPU with one thread both are timed on the thread's own CPU clock (``clock``), which the load
    does not move at all: the fastest of wall-clock times still failed beside six busy processes."""
    torch.manual_seed(0)
    model = models.TransformerLM(vocab_size=vocab, dim=dim, n_layers=layers,
                                 n_heads=max(dim // 64, 1) if dim < 1024 else dim // 128,
                                 max_len=seq).to(device)
    flops = transformer_flops(layers, dim, vocab, batch, seq)
    row, sheet = datasheet_peak(device, bf16)
    # a peak matmul right before every step: the two see the same machine, busy or quiet
    dtype = torch.bfloat16 if bf16 else torch.float32
    peaks = []
    times = step_time(model, batch, seq, device, bf16, compile, steps, all_steps=True,
                      before_each=lambda: peaks.append(matmul_peak(device, dtype, repeats=1)))
    peaks += [matmul_peak(device, dtype, repeats=1) for _ in range(2)]   # after the last step too
    t, peak = min(times), max(peaks)   # the least disturbed step and matmul
    mfu = flops / t / peak
    return {"params": models.count_parameters(model), "matmul_weights": matmul_weights(layers, dim, vocab),
            "flops_per_step": flops, "model_flops": model_flops(layers, dim, vocab, batch, seq),
            "attention_flops": attention_flops(layers, dim, batch, seq),
            "step_s": t, "achieved_flops": flops / t, "peak_flops": peak,
            "mfu": mfu,                                    # against the measured peak
            "datasheet": row, "datasheet_flops": sheet,
            "mfu_datasheet": flops / t / sheet if sheet else None,  # the published kind
            "format": number_format(device, bf16),
            "shape": dict(dim=dim, layers=layers, seq=seq, batch=batch, vocab=vocab),
            "device": str(device), "dtype": "bf16" if bf16 else "float32", "compiled": compile}


def describe(r: dict) -> str:
    s = r["shape"]
    sheet = (f"datasheet {r['format']} peak of the {r['datasheet']} {r['datasheet_flops'] / 1e12:.1f} TFLOP/s: "
             f"MFU {100 * r['mfu_datasheet']:.1f} %" if r.get("mfu_datasheet") else
             "no datasheet peak for this device")
    return (f"TransformerLM d={s['dim']} L={s['layers']} T={s['seq']} B={s['batch']} V={s['vocab']} "
            f"({r['params'] / 1e6:.1f} M parameters) on {r['device']}, {r['dtype']}"
            f"{', compiled' if r['compiled'] else ''}: {r['flops_per_step'] / 1e9:.1f} GFLOP per step "
            f"(model {r['model_flops'] / 1e9:.1f} + attention {r['attention_flops'] / 1e9:.1f}) in "
            f"{1e3 * r['step_s']:.1f} ms = {r['achieved_flops'] / 1e9:.1f} GFLOP/s; measured matmul peak "
            f"{r['peak_flops'] / 1e9:.1f} GFLOP/s: MFU {100 * r['mfu']:.1f} %; {sheet}")


def datasheet_table() -> str:
    """DATASHEET as a Markdown table, in TFLOP/s."""
    cell = lambda v: f"{v / 1e12:,.1f}" if v else "none"  # noqa: E731
    lines = ["| device | bf16 | TF32 | fp32 |", "|---|---|---|---|"]
    lines += [f"| {row} | {cell(p['bf16'])} | {cell(p['tf32'])} | {cell(p['fp32'])} |" for row, p in DATASHEET.items()]
    return "\n".join(lines)


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
    sheet = f"{r['mfu_datasheet']:.4f}" if r["mfu_datasheet"] else "none"
    print(f"summary: mfu={r['mfu']:.4f} mfu_datasheet={sheet} "
          f"step_ms={1e3 * r['step_s']:.2f} peak_gflops={r['peak_flops'] / 1e9:.1f}")
    return 0


if __name__ == "__main__":
    run_main(main)
