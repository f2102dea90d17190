"""FSDP2 observed: what is all-gathered when, reshard on/off, meta init, bf16, HSDP on a 2x2 mesh.

    torchrun --standalone --nproc-per-node=4 -m source_code.sharding.fsdp_demo
    torchrun --standalone --nproc-per-node=2 -m source_code.sharding.fsdp_demo   # no HSDP part

Printed lines (``key: k=v ...``), parsed by notebook 09:

* ``gathers``: the collectives of one step, forward and backward counted apart, for
  reshard_after_forward True and False, and the parameter bytes left unsharded after forward;
* ``meta_init``: peak process memory of building a larger model normally then sharding it vs
  on the meta device then to_empty + init (the shards stay; init_weights makes one full tensor
  at a time, so the peak is the shards plus about the largest tensor) (MALLOC_MMAP_THRESHOLD_=65536 is set by torchrun's
  environment here: export it for meaningful numbers);
* ``bf16``: MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32,
  output_dtype=float32): bytes all-gathered, the loss (computed in fp32) vs fp32, the dtype of
  the kept shards (fp32: FSDP2's master copy);
* ``bf16_logits``: what the policy's fp32 logits save: the fp32 model's logits on 256 sequences,
  and the same logits cast to bf16, through F.cross_entropy per token, as torch's own mean, and
  backward (softmax's gradient): the correct bits of each against fp32; the mean of the bf16
  per-token losses torch's reduction returns against their exact mean, and what a hand-written
  bf16 accumulator adding them one after another returns (the terms it lost);
* ``hsdp``: on 4 ranks, mesh (replicate=2, shard=2): placements, local fraction, replicas equal.
"""
from __future__ import annotations

import argparse
import gc
import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

from source_code.distributed import print0, run_main, session
from source_code import workload
from source_code.sharding.fsdp import MixedPrecisionPolicy, build_sharded, unsharded_parameter_bytes
from source_code.measure import CommCounter, PeakRSS, local

LAUNCH = "torchrun --standalone --nproc-per-node=4 -m source_code.sharding.fsdp_demo"


def _batch(ctx, batch_size=8):
    x, y = workload.rank_slice(workload.global_batch(workload.sort_task(64), 0, batch_size),
                               ctx.rank, ctx.world_size)
    return x.to(ctx.device), y.to(ctx.device)


def gathers(ctx, cfg, reshard: bool) -> dict:
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    model = build_sharded(cfg, mesh, 0, ctx.device, reshard_after_forward=reshard)
    x, y = _batch(ctx)
    fwd, bwd = CommCounter(ctx.world_size), CommCounter(ctx.world_size)
    with fwd:
        loss = workload.loss_fn(model, x, y)
    kept = unsharded_parameter_bytes(model)          # full parameters still alive after forward
    with bwd:
        loss.backward()
    return {"reshard": reshard, "fwd_all_gather": fwd.calls["all_gather"],
            "bwd_all_gather": bwd.calls["all_gather"], "bwd_reduce_scatter": bwd.calls["reduce_scatter"],
            "kept_after_forward": kept, "loss": loss.item()}


def meta_init(ctx, cfg, meta: bool) -> int:
    gc.collect()
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    with PeakRSS(ctx.device) as peak:
        model = build_sharded(cfg, mesh, 0, ctx.device, meta=meta)
    del model
    return peak.peak_bytes


def bf16(ctx, cfg) -> dict:
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    x, y = _batch(ctx)
    out = {}
    # output_dtype=float32: the root's output (the logits) comes back in fp32, so each token's
    # log-softmax and softmax's gradient keep fp32's 24 bits (logit_dtypes shows what bf16 costs)
    for name, policy in (("fp32", None), ("bf16", MixedPrecisionPolicy(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32, output_dtype=torch.float32))):
        model = build_sharded(cfg, mesh, 0, ctx.device, mp_policy=policy)
        c = CommCounter(ctx.world_size)
        with c:
            logits = model(x)                               # (B, T, vocab), fp32 either way
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100)
            loss.backward()
        out[name] = (c.payload["all_gather"], c.payload["reduce_scatter"], loss.item())
        if policy is not None:
            out["loss_dtype"] = str(loss.dtype).replace("torch.", "")
            out["shard_dtype"] = str(local(next(model.parameters())).dtype).replace("torch.", "")
        else:   # the fp32 model's logits on 256 sequences: what casting them to bf16 costs
            xs, ys = workload.global_batch(workload.sort_task(256), 0, 256)
            with torch.no_grad():
                logits = model(xs.to(ctx.device))                   # (256, T, vocab) fp32
            out["logits"] = logit_dtypes(logits.flatten(0, 1), ys.flatten().to(ctx.device)) \
                if ctx.rank == 0 else {}                             # printed by rank 0
    return out


def correct_bits(got: torch.Tensor, want: torch.Tensor) -> float:
    """-log2 of the relative error ||got - want|| / ||want||: bf16 keeps 8 significant bits, fp32 24."""
    return -math.log2(((got.double() - want.double()).norm() / want.double().norm()).item())


def logit_dtypes(logits: torch.Tensor, targets: torch.Tensor) -> dict:
    """The same logits (tokens, vocab) in fp32 and cast to bf16 through F.cross_entropy: per
    token, torch's own mean and its gradient (softmax minus one-hot, over the tokens); the
    bf16 per-token losses added one after another into a bf16 accumulator kept by hand.
    ``spacing``: the gap between bf16 numbers at the exact mean of the bf16 per-token losses."""
    keep = targets != -100
    y = targets[keep]
    z32 = logits[keep].detach().float().requires_grad_()
    z16 = z32.detach().to(torch.bfloat16).requires_grad_()
    loss32, loss16 = (F.cross_entropy(z, y, reduction="none").detach() for z in (z32, z16))
    mean32, mean16 = F.cross_entropy(z32, y), F.cross_entropy(z16, y)   # torch's own reduction
    (mean32 + mean16.float()).backward()                    # each gradient into its own logits
    terms = loss16.cpu()                                     # bf16 per-token losses
    exact = terms.double().mean().item()
    acc, lost = torch.zeros((), dtype=torch.bfloat16), 0
    for t in terms:                                         # a running sum kept in bf16
        nxt = acc + t
        lost += bool(nxt == acc)
        acc = nxt
    return {"tokens": terms.numel(), "loss_bits": correct_bits(loss16, loss32),
            "grad_bits": correct_bits(z16.grad, z32.grad), "fp32_mean": mean32.item(),
            "bf16_mean": mean16.item(), "bf16_terms_exact_mean": exact,
            "by_hand_bf16_mean": acc.item() / terms.numel(), "lost": lost,
            "spacing": 2.0 ** (math.floor(math.log2(abs(exact))) - 7)}   # 8 significant bits


def hsdp(ctx, cfg) -> dict:
    mesh = init_device_mesh(ctx.device.type, (2, ctx.world_size // 2),
                           mesh_dim_names=("replicate", "shard"))
    model = build_sharded(cfg, mesh, 0, ctx.device)  # a 2-D mesh: replicate x shard = HSDP
    x, y = _batch(ctx)
    c = CommCounter(ctx.world_size)
    with c:
        workload.loss_fn(model, x, y).backward()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    opt.step()
    p = next(model.parameters())
    mine = torch.cat([local(q).reshape(-1) for q in model.parameters()])
    # the replica of my shard: the rank with the same shard index in the other replicate group
    shard_index = mesh.get_local_rank("shard")
    peers = [torch.empty_like(mine) for _ in range(ctx.world_size)]
    dist.all_gather(peers, mine)
    replicas = [peers[r] for r in range(ctx.world_size)
                if mesh.mesh.reshape(-1).tolist().index(r) % mesh.size(1) == shard_index]
    equal = all(torch.equal(replicas[0], t) for t in replicas)
    return {"placements": str(p.placements).replace(" ", ""),
            "local_fraction": sum(local(q).numel() for q in model.parameters())
            / sum(q.numel() for q in model.parameters()),
            "replicas_equal": equal, "calls": dict(c.calls)}


def run(ctx, args) -> None:
    cfg = workload.model_config(dim=args.dim, n_layers=args.layers)
    for reshard in (True, False):
        r = gathers(ctx, cfg, reshard)
        print0("gathers: " + " ".join(f"{k}={v}" for k, v in r.items()))
    big = workload.model_config(dim=args.big_dim, n_layers=args.big_layers)
    n_big = sum(p.numel() for p in workload.build_model(big, 0).parameters())
    peaks = {m: meta_init(ctx, big, m) for m in (True, False)}  # meta first: nothing freed to reuse
    sizes = [p.numel() for p in workload.build_model(big, 0).parameters()]
    shard = 4 * sum(-(-n // ctx.world_size) for n in sizes)  # what stays: this rank's shards
    print0(f"meta_init: params={n_big} full_mib={4 * n_big / 2**20:.1f} "
           f"normal_peak_mib={peaks[False] / 2**20:.1f} meta_peak_mib={peaks[True] / 2**20:.1f} "
           f"shard_mib={shard / 2**20:.2f} largest_tensor_mib={4 * max(sizes) / 2**20:.2f}")
    b = bf16(ctx, cfg)
    print0(f"bf16: fp32_all_gather={b['fp32'][0]} bf16_all_gather={b['bf16'][0]} "
           f"fp32_reduce_scatter={b['fp32'][1]} bf16_reduce_scatter={b['bf16'][1]} "
           f"fp32_loss={b['fp32'][2]:.6f} bf16_loss={b['bf16'][2]:.6f} loss_dtype={b['loss_dtype']} "
           f"shard_dtype={b['shard_dtype']}")
    print0("bf16_logits: " + " ".join(f"{k}={v:.8g}" if isinstance(v, float) else f"{k}={v}"
                                      for k, v in b["logits"].items()))
    if ctx.world_size == 4:
        h = hsdp(ctx, cfg)
        calls = ",".join(f"{k}:{v}" for k, v in sorted(h.pop("calls").items()))
        print0("hsdp: " + " ".join(f"{k}={v}" for k, v in h.items()) + f" calls={calls}")
    dist.barrier()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--big-dim", type=int, default=256, help="model size for the meta-init comparison")
    p.add_argument("--big-layers", type=int, default=8)
    args = p.parse_args(argv)
    if args.dim % 4 or args.big_dim % 4:
        p.error("--dim and --big-dim must be multiples of 4 (the attention heads)")
    torch.set_num_threads(1)
    with session(launch_hint=LAUNCH) as ctx:
        run(ctx, args)
    return 0


if __name__ == "__main__":
    run_main(main)
