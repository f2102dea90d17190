"""Where the bytes of training go: counted activations vs the formula, precisions, recomputation.

    python -m source_code.memory.report                  # CPU, about 15 s
    python -m source_code.memory.report --attention math --seq 256 --dim 128 --heads 8 --batch 2
    python -m source_code.memory.report --device auto    # a GPU if the policy gives one (+ allocator peak)
    python -m source_code.memory.report --device auto --snapshot timeline.png

Printed, one line each:

* ``activations:`` for each configuration (batch, sequence, hidden, blocks, heads, vocabulary,
  precision mode) the bytes autograd saves, counted with saved-tensor hooks (saved.py), and the
  formula's (formula.py), with their relative error;
* ``block16:`` one block in 16 bits: counted, our formula, Korthikanti et al.'s s b h (34 + 5 a s / h);
* ``bytes_per_param:`` parameters + gradients + optimizer state per parameter after one AdamW
  step, for fp32, bf16 autocast, bf16 with fp32 master weights (the ZeRO paper's bookkeeping,
  and Megatron-LM's with fp32 main gradients), fp16 + GradScaler, pure bf16;
* ``recompute:`` a model of ``--layers`` blocks: peak bytes, FLOPs and time of a step, none /
  full / selective, with a fused (flash) or unfused (math) attention;
* ``accumulation:`` 4 micro-batches vs the whole batch: largest weight difference;
* on a GPU ``gpu:`` the allocator's peak (max_memory_allocated) beside the counted peak;

and last

    summary: device=D ... megatron_bytes_per_param=M activation_bytes_rel_error=E
             adam_8bit_moment_bytes_per_param=Q kahan_drift_max_abs_diff=K stochastic_drift_ratio=S
             offload_packed_bytes=P offload_max_abs_grad_diff=G recompute_memory_ratio=R

M: bytes per parameter counted in a step of Megatron-LM's bookkeeping; E: the largest relative
error of the formula over the configurations (goal: E <= 0.01); R: the peak bytes a step
allocates with full checkpointing / without; Q: Adam's two moments in 8 bits, bytes per
parameter counted (optimizer_precision.py); K: how far the bf16 weights with Kahan compensation
end from the fp32 master copy's, rounded (compensated.py, goal 0); S: the mean drift of
stochastically rounded bf16 weights over the fp32 one (goal near 1; plain bf16 gives 0);
P: the bytes save_on_cpu packs in a step (offload.py); G: its gradients against the plain step's.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from source_code.cli import Parser, positive_int, writable_path
from source_code.distributed import pick_device
from source_code.errors import run_main
from source_code.memory import (accumulation, compensated, formula, offload, optimizer_precision, precision,
                                recompute)
from source_code.memory.saved import saved_bytes
from source_code.models import Block, TransformerLM

# (batch, seq, hidden, layers, heads, vocab, mode)
CONFIGS = [(4, 32, 64, 2, 4, 32, "fp32"), (2, 64, 128, 3, 8, 50, "fp32"),
           (4, 32, 64, 2, 4, 32, "bf16"), (3, 48, 96, 1, 6, 17, "autocast")]
DTYPE = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "autocast": torch.float32}


def counted_activations(batch, seq, hidden, layers, heads, vocab, mode, device="cpu") -> dict:
    """{"counted", "formula", "rel_error"} for one configuration on ``device``."""
    torch.manual_seed(0)
    model = TransformerLM(vocab_size=vocab, dim=hidden, n_layers=layers, n_heads=heads,
                          max_len=seq).to(device, DTYPE[mode])
    x = torch.randint(0, vocab, (batch, seq), device=device)
    y = torch.randint(0, vocab, (batch, seq), device=device)

    def forward():
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=mode == "autocast"):
            logits = model(x)
        return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())    # the loss in fp32

    counted = saved_bytes(forward, model.parameters())
    predicted = formula.model_activation_bytes(batch, seq, hidden, layers, heads, vocab, mode=mode,
                                               device=torch.device(device).type)["total"]
    return {"counted": counted, "formula": predicted, "rel_error": abs(counted - predicted) / predicted}


def block16(batch: int = 4, seq: int = 128, hidden: int = 64, heads: int = 4, device="cpu") -> dict:
    """One Block in bf16: counted bytes, our formula, the Korthikanti rule and its differences."""
    torch.manual_seed(0)
    block = Block(hidden, heads).to(device, torch.bfloat16)
    x = torch.randn(batch, seq, hidden, device=device, dtype=torch.bfloat16, requires_grad=True)
    kind = torch.device(device).type
    return {"counted": saved_bytes(lambda: block(x * 1), block.parameters()),   # x * 1: the input, saved by norm1
            "formula": batch * seq * formula.block_bytes_per_token(hidden, heads, mode="bf16", device=kind),
            "korthikanti": formula.korthikanti_block_bytes(batch, seq, hidden, heads),
            "differences": formula.korthikanti_differences(batch, seq, hidden, heads, kind)}


def run(device: str = "cpu", dim: int = 64, seq: int = 64, batch: int = 8, repeats: int = 5,
        snapshot: str | None = None, heads: int = 4, layers: int = 4, attention: str = "flash") -> dict:
    kind = torch.device(device).type
    rows = [(c, counted_activations(*c, device=device)) for c in CONFIGS]
    for c, r in rows:
        print(f"activations: batch={c[0]} seq={c[1]} hidden={c[2]} blocks={c[3]} heads={c[4]} "
              f"vocab={c[5]} mode={c[6]} counted={r['counted']} formula={r['formula']:.0f} "
              f"rel_error={r['rel_error']:.2e}", flush=True)
    b = block16(device=device)
    print(f"block16: counted={b['counted']} formula={b['formula']:.0f} korthikanti={b['korthikanti']:.0f}")
    per = precision.per_parameter()
    print("bytes_per_param: " + " ".join(f"{w}={v['total']:.2f}" for w, v in per.items()), flush=True)
    torch.manual_seed(0)
    model = TransformerLM(vocab_size=32, dim=dim, n_layers=layers, n_heads=heads, max_len=seq).to(device)
    rec = recompute.measure(model, batch, seq, repeats, attention=attention)
    print(f"recompute: attention={attention} " + " ".join(
        f"{m}_peak_mib={r['peak'] / 2**20:.2f} {m}_flops_ratio={r['flops_ratio']:.3f} "
        f"{m}_time_ratio={r['time_ratio']:.2f}" for m, r in rec.items()), flush=True)
    acc = accumulation.same_update()
    print(f"accumulation: micro_batches={acc['micro_batches']} max_abs_diff={acc['max_abs_diff']:.2e}")
    moments = {f: optimizer_precision.state_bytes_per_param(f) for f in optimizer_precision.FORMATS}
    q = moments["8bit"]
    fix = compensated.small_updates()
    k = (fix["kahan"]["drift"] - fix["fp32-master"]["drift"]).abs().max().item()
    sr = fix["stochastic"]["drift"].mean().item() / fix["fp32_master_drift"].mean().item()
    off = offload.measure(device=device, repeats=1)
    print("precision_depth: adam_moment_bytes_per_param " + " ".join(f"{f}={v:.3f}" for f, v in moments.items())
          + f" kahan_moved={fix['kahan']['moved']:.3f} stochastic_moved={fix['stochastic']['moved']:.3f} "
          f"offload_packed={off['packed']} offload_copied={off['copied']}", flush=True)
    out = {"rows": rows, "block16": b, "per_param": per, "recompute": rec, "accumulation": acc,
           "E": max(r["rel_error"] for _, r in rows), "R": rec["full"]["peak_ratio"],
           "Q": q, "K": k, "S": sr, "offload": off}
    if kind == "cuda":
        from source_code.memory import gpu
        g = gpu.allocator_vs_counted(model, batch, seq, snapshot)
        print("gpu: " + " ".join(f"{m}_allocator_peak_mib={g[m]['allocator_peak'] / 2**20:.2f} "
                                 f"{m}_counted_peak_mib={g[m]['counted_peak'] / 2**20:.2f}" for m in gpu.MODES)
              + f" allocator_ratio={g['allocator_ratio']:.3f}")
        print(gpu.tf32_note())
        out["gpu"] = g
    return out


def parse(argv=None):
    """The flags, every one checked before any work: one line naming the fix, exit status 2."""
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cpu", "auto"), default="cpu",
                   help="auto: the device policy's choice (one GPU if there is one)")
    p.add_argument("--dim", type=positive_int, default=64, help="hidden size of the recomputation model")
    p.add_argument("--heads", type=positive_int, default=4, help="its attention heads (divide --dim)")
    p.add_argument("--layers", type=positive_int, default=4, help="its blocks")
    p.add_argument("--seq", type=positive_int, default=64)
    p.add_argument("--batch", type=positive_int, default=8)
    p.add_argument("--attention", choices=tuple(recompute.ATTENTION), default="flash",
                   help="flash: the fused kernel; math: unfused, the s x s scores kept")
    p.add_argument("--repeats", type=positive_int, default=5, help="timed steps per recomputation mode")
    p.add_argument("--snapshot", type=writable_path, default=None,
                   help="GPU only: draw the memory snapshot's timeline to this .png")
    args = p.parse_args(argv)
    if args.dim % args.heads:
        p.error(f"--dim {args.dim} is not divisible by --heads {args.heads}; choose a multiple of the heads")
    if args.snapshot and not args.snapshot.lower().endswith(".png"):
        p.error(f"--snapshot {args.snapshot}: give a file name ending in .png")
    device = pick_device()[0] if args.device == "auto" else torch.device("cpu")
    if args.snapshot and device.type != "cuda":
        p.error("--snapshot needs a GPU (--device auto on a machine with one)")
    return args, device


def main(argv=None):
    args, device = parse(argv)
    if device.type == "cpu":
        torch.set_num_threads(min(torch.get_num_threads(), 2))
    print(f"device: {device}", flush=True)
    out = run(str(device), args.dim, args.seq, args.batch, args.repeats, args.snapshot, args.heads,
              args.layers, args.attention)
    pp = out["per_param"]
    print(f"summary: device={device} configs={len(out['rows'])} fp32_bytes_per_param={pp['fp32']['total']:.2f} "
          f"bf16_mixed_bytes_per_param={pp['bf16-mixed']['total']:.2f} "
          f"fp16_scaler_bytes_per_param={pp['fp16-scaler']['total']:.2f} "
          f"megatron_bytes_per_param={pp['bf16-megatron']['total']:.2f} "
          f"activation_bytes_rel_error={out['E']:.2e} "
          f"adam_8bit_moment_bytes_per_param={out['Q']:.3f} kahan_drift_max_abs_diff={out['K']:.1e} "
          f"stochastic_drift_ratio={out['S']:.3f} offload_packed_bytes={out['offload']['packed']} "
          f"offload_max_abs_grad_diff={out['offload']['max_abs_grad_diff']:.1e} "
          f"recompute_memory_ratio={out['R']:.3f}")                 # last, as readers of the line expect
    return 0 if out["E"] <= 0.01 else 1


if __name__ == "__main__":
    run_main(main)
