"""bf16 mixed precision with fp32 master weights, counted: what one rank keeps, byte by byte.

    python -m source_code.sharding.mixed_precision

The bookkeeping of DeepSpeed and Megatron-LM: the model computes in bf16 (its weights and
gradients are bf16, 2 bytes each), and the optimizer keeps an fp32 *master* copy of every
weight plus Adam's exp_avg and exp_avg_sq in fp32 (4 + 4 + 4 bytes). A step: the bf16 gradient
is copied to fp32 onto the master weight (a transient buffer), AdamW updates the master copy, the
master is rounded back into the bf16 weight. The loss is computed in fp32 (the logits cast up
before the softmax), as reductions over many values lose too much in bf16's 8-bit mantissa.

One step of that on the TransformerLM, in one process, counting tensor bytes (storages once) as
notebook 09's exercise predicts them for DDP; with ZeRO the master copy and the moments are
sharded together (they are all optimizer state).
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from source_code import workload
from source_code.measure import tensor_bytes


def bf16_step_bytes(cfg: dict, seed: int = 0, batch_size: int = 8) -> dict:
    """{"n_params", "params", "grads", "optimizer", "total", "loss_dtype"} after one step."""
    model = workload.build_model(cfg, seed).to(torch.bfloat16)      # the bf16 working copy
    params = list(model.parameters())
    master = [p.detach().float().requires_grad_() for p in params]  # fp32 master weights
    opt = torch.optim.AdamW(master, lr=1e-3)
    x, y = workload.global_batch(workload.sort_task(64), 0, batch_size)
    logits = model(x)                                                # bf16
    loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=-100)
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


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    args = p.parse_args(argv)
    if args.dim % 4 or args.layers < 1:
        p.error("--dim must be a multiple of 4 and --layers >= 1")
    b = bf16_step_bytes(workload.model_config(dim=args.dim, n_layers=args.layers))
    n = b["n_params"]
    print(f"bf16_step: n_params={n} " + " ".join(
        f"{k}_per_param={b[k] / n:.2f}" for k in ("params", "grads", "optimizer", "total"))
        + f" loss_dtype={b['loss_dtype']}")
    return 0


if __name__ == "__main__":
    from source_code.errors import run_main   # a LaunchError: its one line, exit status 2
    run_main(main)
