"""bf16 mixed precision with fp32 master weights, counted: what one rank keeps, byte by byte.

    python -m source_code.memory.mixed_precision                # both bookkeepings, one line each
    python -m source_code.memory.mixed_precision --dp 8         # + Megatron's distributed optimizer

The model computes in bf16 (its weights are bf16, 2 bytes each) and the optimizer keeps an fp32
*master* copy of every weight plus Adam's exp_avg and exp_avg_sq in fp32 (4 + 4 + 4 bytes,
K = 12 in the ZeRO paper's notation). Where the gradients live is where the two well-known
bookkeepings differ:

* ``bf16_step_bytes``: the ZeRO paper's accounting (Rajbhandari et al. 2020, 2 + 2 + K with
  16-bit gradients), the one DeepSpeed's ZeRO documentation uses: the gradients stay bf16 in
  ``.grad`` and a transient fp32 copy feeds the step: 2 + 2 + 12 = 16 bytes a parameter;
* ``megatron_step_bytes``: Megatron-LM's: every bf16 gradient is accumulated, as soon as
  backward produces it, into one contiguous fp32 buffer (``main_grad``) and the bf16 gradient
  is freed, so gradient accumulation and the data-parallel reduction run in fp32:
  2 + 4 + 12 = 18 bytes a parameter. Its distributed optimizer shards the master weights and
  the moments over the d data-parallel ranks (rank r steps the r-th slice of the flat buffer,
  after the reduce-scatter) and keeps the bf16 weights and the fp32 buffer whole: 6 + 12/d.

The loss is computed in fp32 (the logits cast up before the softmax): bf16 keeps 7 explicit
mantissa bits (8 with the implicit leading one), too few for a softmax and a mean over many
tokens. Each function runs one real step on the TransformerLM in one process and counts tensor
bytes (storages once); for d > 1 it allocates what rank 0 of d allocates (the collectives that
would fill its slice are left out). source_code/memory/calculator.py names the same variants
("bf16", "bf16-megatron"); notebook 09's exercise predicts the first one per strategy.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from source_code import workload
from source_code.cli import Parser, positive_int
from source_code.measure import tensor_bytes


def _step_loss(model, batch_size: int) -> torch.Tensor:
    x, y = workload.global_batch(workload.sort_task(64), 0, batch_size)
    logits = model(x)                                                # bf16
    return F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=-100)


def bf16_step_bytes(cfg: dict, seed: int = 0, batch_size: int = 8) -> dict:
    """The ZeRO paper's bookkeeping, one step: {"n_params", "params", "grads", "optimizer",
    "total", "loss_dtype"} in bytes."""
    model = workload.build_model(cfg, seed).to(torch.bfloat16)      # the bf16 working copy
    params = list(model.parameters())
    master = [p.detach().float().requires_grad_() for p in params]  # fp32 master weights
    opt = torch.optim.AdamW(master, lr=1e-3)
    loss = _step_loss(model, batch_size)
    loss.backward()                                                  # bf16 gradients
    for p, m in zip(params, master):
        m.grad = p.grad.float()                                      # transient fp32 copy
    opt.step()
    for p, m in zip(params, master):
        m.grad = None                                                # freed after the step
        p.data.copy_(m.detach())                                     # round back to bf16
    state = [t for s in opt.state.values() for k, t in s.items() if k != "step"]
    out = {"n_params": sum(p.numel() for p in params),
           "params": tensor_bytes(params), "grads": tensor_bytes([p.grad for p in params]),
           "optimizer": tensor_bytes(master + state), "loss_dtype": str(loss.dtype)}
    out["total"] = out["params"] + out["grads"] + out["optimizer"]
    return out


def megatron_step_bytes(cfg: dict, dp: int = 1, seed: int = 0, batch_size: int = 8) -> dict:
    """Megatron-LM's bookkeeping, one step on rank 0 of ``dp``: fp32 main gradients in one flat
    buffer, the optimizer on this rank's slice of it. Same keys as bf16_step_bytes, plus
    "slice" (parameters this rank's optimizer steps)."""
    if dp < 1:
        raise ValueError(f"dp={dp}: the data-parallel size is at least 1")
    model = workload.build_model(cfg, seed).to(torch.bfloat16)
    params = list(model.parameters())
    n = sum(p.numel() for p in params)
    main_grad = torch.zeros(n, dtype=torch.float32)                 # Megatron's grad buffer
    for p, slot in zip(params, main_grad.split([p.numel() for p in params])):
        p.main_grad = slot.view_as(p)

        def accumulate(p):                                           # as soon as p.grad is ready
            p.main_grad.add_(p.grad)                                 # bf16 -> fp32 accumulation
            p.grad = None                                            # the bf16 gradient is freed
        p.register_post_accumulate_grad_hook(accumulate)
    lo, hi = 0, min(n, -(-n // dp))                                  # rank 0's slice of the buffer
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    master = flat[lo:hi].float().requires_grad_()                    # fp32 master weights, 1/dp
    del flat
    opt = torch.optim.AdamW([master], lr=1e-3)
    loss = _step_loss(model, batch_size)
    loss.backward()
    master.grad = main_grad[lo:hi]                                   # (after the reduce-scatter)
    opt.step()
    master.grad = None
    offset = 0
    for p in params:                                                 # round the slice back to bf16
        a, b = max(lo, offset), min(hi, offset + p.numel())
        if a < b:
            p.data.view(-1)[a - offset:b - offset].copy_(master.detach()[a - lo:b - lo])
        offset += p.numel()                                          # (then all-gathered)
    state = [t for s in opt.state.values() for k, t in s.items() if k != "step"]
    out = {"n_params": n, "slice": hi - lo, "params": tensor_bytes(params),
           "grads": tensor_bytes([p.grad for p in params] + [main_grad]),
           "optimizer": tensor_bytes([master] + state), "loss_dtype": str(loss.dtype)}
    out["total"] = out["params"] + out["grads"] + out["optimizer"]
    return out


def per_param_line(name: str, b: dict) -> str:
    n = b["n_params"]
    return (f"{name}: n_params={n} " + " ".join(f"{k}_per_param={b[k] / n:.2f}"
                                               for k in ("params", "grads", "optimizer", "total"))
            + f" loss_dtype={b['loss_dtype']}")


def main(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--dim", type=positive_int, default=64)
    p.add_argument("--heads", type=positive_int, default=4)
    p.add_argument("--layers", type=positive_int, default=2)
    p.add_argument("--dp", type=positive_int, default=1,
                   help="data-parallel ranks of Megatron's distributed optimizer (1: none)")
    args = p.parse_args(argv)
    if args.dim % args.heads:
        p.error(f"--dim {args.dim} is not divisible by --heads {args.heads}; choose a multiple")
    cfg = workload.model_config(dim=args.dim, n_layers=args.layers, n_heads=args.heads)
    print(per_param_line("bf16_step", bf16_step_bytes(cfg)), flush=True)
    print(per_param_line("megatron_step", megatron_step_bytes(cfg)), flush=True)
    if args.dp > 1:
        print(per_param_line(f"megatron_distributed_optimizer_dp{args.dp}",
                             megatron_step_bytes(cfg, args.dp)), flush=True)
    return 0


if __name__ == "__main__":
    from source_code.errors import run_main   # a LaunchError: its one line, exit status 2
    run_main(main)
