"""Memory per rank, counted and predicted, for DDP, ZeRO-1, ZeRO-2 and FSDP on 1, 2 and 4 ranks.

    python -m source_code.sharding.memory_report
    python -m source_code.sharding.memory_report --dim 512 --layers 8 --world-sizes 1 2 4 8

For each world size N, N processes (torch.multiprocessing) train the same TransformerLM with each strategy in turn, one AdamW step each. After
the step (before zero_grad) rank 0 counts the bytes of its local parameter, gradient
and optimizer-state tensors (measure.state_bytes) and sets them beside the
prediction (source_code/sharding/memory_model.py); the peak process memory is measured above the
memory before the model is built, up to the end of the step, with
MALLOC_MMAP_THRESHOLD_=65536 (torch.cuda.max_memory_allocated on a GPU), and the collectives
of the step are counted (measure.CommCounter). The last line is

    fsdp_state_bytes_ratio=R      R = FSDP (params + grads + optimizer) / DDP's, at the largest N

Every row runs on the same kind of device (measure.table_device), and the first line says
which: one GPU per process when the node has a GPU for each process of the largest N,
otherwise every N on the CPU with gloo ("device: cpu (1 GPU < 4 processes)"), so that a GPU's
allocated bytes are never set beside a CPU process's resident memory.
"""
from __future__ import annotations

import argparse
import gc
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.parallel import DistributedDataParallel as DDP

from source_code import torch_versions
from source_code.errors import run_main
from source_code.distributed import context
from source_code.sharding import memory_model
from source_code import workload
from source_code.sharding.fsdp import build_sharded
from source_code.measure import CommCounter, PeakRSS, state_bytes, table_device, tensor_bytes
from source_code.sharding.zero import ZeroAdamW

STRATEGIES = ("ddp", "zero1", "zero2", "fsdp", "fsdp_keep")  # fsdp_keep: reshard_after_forward=False
BASE = {"ddp": "ddp", "zero1": "zero1", "zero2": "zero2", "fsdp": "fsdp", "fsdp_keep": "fsdp"}


def _build(strategy: str, cfg: dict, ctx, seed: int = 0):
    if strategy in ("fsdp", "fsdp_keep"):
        mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
        model = build_sharded(cfg, mesh, seed, ctx.device, meta=True,
                              reshard_after_forward=strategy == "fsdp")
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3)
    model = workload.build_model(cfg, seed, ctx.device)
    if strategy == "ddp":
        model = DDP(model, device_ids=ctx.device_ids)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3)
    return model, ZeroAdamW(model, stage=int(strategy[-1]), lr=1e-3)


def _step(model, opt, x, y):
    workload.loss_fn(model, x, y).backward()
    opt.step()


def _activation_bytes(model, x, y) -> int:
    """Bytes autograd saves for backward in one forward (parameters excluded), counted."""
    params = list(model.parameters())
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        loss = workload.loss_fn(model, x, y)
    n = tensor_bytes(kept, exclude=params)
    del loss, kept
    return n


def measure_rank(cfg: dict, batch_size: int, strategies=STRATEGIES) -> list[dict] | None:
    """On every rank of a group (run by processes.spawn): one row per strategy from rank 0."""
    ctx = context()
    dataset = workload.sort_task(n=4 * batch_size)
    x, y = workload.rank_slice(workload.global_batch(dataset, 0, batch_size), ctx.rank, ctx.world_size)
    x, y = x.to(ctx.device), y.to(ctx.device)
    numels = [p.numel() for p in workload.build_model(cfg, 0).parameters()]
    # gloo connects and allocates its buffers on the first collectives: pay that before measuring
    probe = torch.zeros(ctx.world_size, device=ctx.device)
    dist.all_reduce(probe)
    dist.all_gather_into_tensor(probe, probe[ctx.rank:ctx.rank + 1].clone())
    tiny = workload.model_config(dim=16, n_layers=1)
    for s in ("ddp", "fsdp"):  # one-time costs of the first model, step and DDP/FSDP setup
        model, opt = _build(s, tiny, ctx)
        _step(model, opt, x, y)
        del model, opt
    rows = []
    for s in strategies:
        gc.collect()  # the previous strategy's tensors are gone before the baseline is taken
        counter = CommCounter(ctx.world_size)
        with PeakRSS(ctx.device) as peak:                 # build + one step (creates Adam state)
            model, opt = _build(s, cfg, ctx)
            with counter:
                _step(model, opt, x, y)
        counted = state_bytes(model, opt)
        predicted = memory_model.state_bytes(numels, ctx.world_size, BASE[s])
        row = {"world_size": ctx.world_size, "strategy": s, "n_params": sum(numels), **counted,
               **{f"pred_{k}": v for k, v in predicted.items()},
               "peak_bytes": peak.peak_bytes, "device": ctx.device.type,
               "wire_bytes": counter.wire, "calls": dict(counter.calls),
               "pred_wire_bytes": memory_model.communication_bytes(
                   sum(numels), ctx.world_size, BASE[s], reshard_after_forward=s != "fsdp_keep")}
        if s == "ddp":
            row["activations"] = _activation_bytes(model.module, x, y)
            row["pred_activations"] = memory_model.activation_bytes(
                x.shape[0], x.shape[1], cfg["dim"], cfg["n_layers"], cfg["n_heads"], cfg["vocab_size"])
        rows.append(row)
        del model, opt
    return rows if ctx.is_main else None


def measure(world_sizes=(1, 2, 4), cfg: dict | None = None, batch_size: int = 16,
            strategies=STRATEGIES, device: str | None = None) -> list[dict]:
    """All rows for all world sizes (starts world_size processes for each), every one on the
    device ``table_device`` picks for the largest world size (or ``device``: "cpu", "auto")."""
    from source_code.processes import spawn
    cfg = cfg or workload.model_config(dim=192, n_layers=4)
    device = device or table_device(world_sizes)[0]
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", "65536")  # freed memory goes back to the OS
    rows = []
    for n in world_sizes:
        rows += spawn(measure_rank, n, cfg, batch_size, tuple(strategies), device=device)[0]
    return rows


def ratio(rows: list[dict]) -> float:
    """FSDP's counted per-rank state over DDP's at the largest world size measured."""
    n = max(r["world_size"] for r in rows)
    by = {r["strategy"]: r for r in rows if r["world_size"] == n}
    return by["fsdp"]["total"] / by["ddp"]["total"]


def worst_prediction_error(rows: list[dict]) -> float:
    return max(abs(r[f"pred_{k}"] - r[k]) / r[k] for r in rows
               for k in ("params", "grads", "optimizer", "total"))


def memory_lines(rows: list[dict]) -> list[str]:
    mib = 2 ** 20
    kinds = {r.get("device", "cpu") for r in rows}
    if len(kinds) > 1:  # measure() never mixes them; rows put together by hand might
        raise ValueError(f"rows measured on different devices ({', '.join(sorted(kinds))}): "
                         "their peaks do not compare; measure every row on one kind of device")
    peak = "allocated on the GPU" if kinds == {"cuda"} else "process RSS, on the CPU"
    out = [f"{'N':>2} {'strategy':9s} {'params':>7s} {'grads':>7s} {'optim':>7s} {'total':>7s} "
           f"{'predicted':>9s} {'peak':>9s}   (MiB per rank, rank 0; peak: {peak})"]
    for r in rows:
        out.append(f"{r['world_size']:>2d} {r['strategy']:9s} {r['params'] / mib:7.2f} "
                   f"{r['grads'] / mib:7.2f} {r['optimizer'] / mib:7.2f} {r['total'] / mib:7.2f} "
                   f"{r['pred_total'] / mib:9.2f} {r['peak_bytes'] / mib:9.1f}")
    return out


def comm_lines(rows: list[dict]) -> list[str]:
    mib = 2 ** 20
    out = [f"{'N':>2} {'strategy':9s} {'sent/rank':>9s} {'formula':>8s}  collectives per step"
           "   (MiB per rank per step)"]
    for r in rows:
        if r["world_size"] == 1:
            continue
        calls = ", ".join(f"{k} x{v}" for k, v in sorted(r["calls"].items()))
        out.append(f"{r['world_size']:>2d} {r['strategy']:9s} {r['wire_bytes'] / mib:9.2f} "
                   f"{r['pred_wire_bytes'] / mib:8.2f}  {calls}")
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world-sizes", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--dim", type=int, default=192)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=16, help="global batch (divisible by each N)")
    args = p.parse_args(argv)
    if any(n < 1 for n in args.world_sizes) or any(args.batch_size % n for n in args.world_sizes):
        p.error("--world-sizes must be >= 1 and each divide --batch-size")
    if args.dim % 4:
        p.error("--dim must be a multiple of 4 (the attention heads)")
    torch.set_num_threads(1)
    device, line = table_device(args.world_sizes)
    torch_versions.require("fsdp2", device)  # before any process starts: one line on an older torch
    print(line)
    rows = measure(args.world_sizes, workload.model_config(dim=args.dim, n_layers=args.layers),
                   args.batch_size, device=device)
    print("\n".join(memory_lines(rows)))
    print()
    print("\n".join(comm_lines(rows)))
    acts = [r for r in rows if "activations" in r]
    for r in acts:
        print(f"activations N={r['world_size']}: counted {r['activations'] / 2**20:.2f} MiB, "
              f"predicted {r['pred_activations'] / 2**20:.2f} MiB")
    print(f"worst prediction error: {100 * worst_prediction_error(rows):.2f} %")
    print(f"fsdp_state_bytes_ratio={ratio(rows):.4f}")
    return 0


if __name__ == "__main__":
    run_main(main)
