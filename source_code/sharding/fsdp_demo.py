"""FSDP2 observed: what is all-gathered when, reshard on/off, meta init, bf16, HSDP on a 2x2 mesh.

    torchrun --standalone --nproc-per-node=4 -m source_code.sharding.fsdp_demo
    torchrun --standalone --nproc-per-node=2 -m source_code.sharding.fsdp_demo   # no HSDP part

Printed lines (``key: k=v ...``), parsed by notebook 09:

* ``gathers``: the collectives of one forward and backward (no optimizer step), counted apart, for
  reshard_after_forward True and False, and the parameter bytes left unsharded after forward;
* ``meta_init``: peak process memory of building a larger model normally then sharding it vs
  on the meta device then to_empty + init (the shards stay; init_weights makes one full tensor
  at a time, as ``randn(shape) * 0.02``: the draw and its scaled copy, so the peak is at most the
  shards plus twice the largest tensor) (MALLOC_MMAP_THRESHOLD_=65536 is set by torchrun's
  environment here: export it for meaningful numbers);
* ``bf16``: MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32,
  output_dtype=float32): bytes all-gathered, the loss (computed in fp32) vs fp32, the dtype of
  the kept shards (fp32: FSDP2's master copy);
* ``bf16_logits``: one forward and backward (no optimizer step) on 128 sequences with the fp32 model, the policy, and the policy with
  the head in an fp32 group of its own; rank 0's logits, per-token losses and the gradient its
  head received against the fp32 model's (bf16_logits.py): the policy's logits are bf16 numbers
  in an fp32 tensor, and the head receives their fp32 gradient rounded to bf16;
* ``bf16_loss_arithmetic``: the policy's logits through F.cross_entropy in bf16 against fp32 (what
  output_dtype changes), torch's bf16 mean against the exact mean of the same bf16 per-token
  losses, and a bf16 accumulator kept by hand adding them one after another (the terms it lost);
* ``bf16_rounding``: the fp32 model's logits rounded to bf16, as they are and scaled to a trained
  model's size (``--trained-logit``): each token's loss error against its bound (1-p)(e^{2d} - 1),
  d = max|z| 2^-8 (bf16's unit roundoff), and against the loss itself;
* ``hsdp``: on 4 ranks, mesh (replicate=2, shard=2): placements, local fraction, replicas equal.
"""
from __future__ import annotations

import argparse
import gc

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from source_code.distributed import print0, run_main, session
from source_code import workload
from source_code.sharding import bf16_logits
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


def bf16(ctx, cfg, trained_logit: float) -> dict:
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    xs, ys = (t.to(ctx.device) for t in workload.rank_slice(   # 128 sequences, 1/N each
        workload.global_batch(workload.sort_task(128), 0, 128), ctx.rank, ctx.world_size))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                  output_dtype=torch.float32)
    fp32_head = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32)
    out, runs = {}, {}
    # output_dtype=float32 casts the root's output up after the head's bf16 matmul: the loss is
    # taken in fp32 from bf16-valued logits, and the cast's backward rounds the gradient into the
    # head to bf16; "fp32_head" puts the head in an fp32 group of its own
    for name, mp, head in (("fp32", None, None), ("bf16", policy, None), ("fp32_head", policy, fp32_head)):
        model = build_sharded(cfg, mesh, 0, ctx.device, mp_policy=mp, head_policy=head)
        c = CommCounter(ctx.world_size)
        with c:                                   # forward, loss, backward: no optimizer step
            runs[name] = bf16_logits.head_signals(model, xs, ys)
        out[name] = (c.payload["all_gather"], c.payload["reduce_scatter"], runs[name][3])
        if name == "bf16":
            out["loss_dtype"] = str(runs[name][3].dtype).replace("torch.", "")
            out["shard_dtype"] = str(local(next(model.parameters())).dtype).replace("torch.", "")
    if ctx.rank == 0:                             # printed by rank 0: its tokens
        targets = ys.flatten()
        out["logits"] = bf16_logits.policy_report(runs, targets)
        out["loss_arithmetic"] = bf16_logits.loss_arithmetic(runs["bf16"][0], targets)
        out["rounding"] = {f"{k}_at_{name}": v for name, size in (("model", None), ("trained", trained_logit))
                           for k, v in bf16_logits.rounding_at_scale(runs["fp32"][0], targets, size).items()}
    return out


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
    sizes = [p.numel() for p in workload.build_model(big, 0).parameters()]
    n_big = sum(sizes)
    peaks = {m: meta_init(ctx, big, m) for m in (True, False)}  # meta first: nothing freed to reuse
    shard = 4 * sum(-(-n // ctx.world_size) for n in sizes)  # what stays: this rank's shards
    print0(f"meta_init: params={n_big} full_mib={4 * n_big / 2**20:.1f} "
           f"normal_peak_mib={peaks[False] / 2**20:.1f} meta_peak_mib={peaks[True] / 2**20:.1f} "
           f"shard_mib={shard / 2**20:.2f} largest_tensor_mib={4 * max(sizes) / 2**20:.2f}")
    b = bf16(ctx, cfg, args.trained_logit)
    print0(f"bf16: fp32_all_gather={b['fp32'][0]} bf16_all_gather={b['bf16'][0]} "
           f"fp32_reduce_scatter={b['fp32'][1]} bf16_reduce_scatter={b['bf16'][1]} "
           f"fp32_loss={b['fp32'][2].item():.6f} bf16_loss={b['bf16'][2].item():.6f} loss_dtype={b['loss_dtype']} "
           f"shard_dtype={b['shard_dtype']}")
    for key in ("logits", "loss_arithmetic", "rounding"):
        print0(f"bf16_{key}: " + " ".join(f"{k}={v:.8g}" if isinstance(v, float) else f"{k}={v}"
                                         for k, v in b.get(key, {}).items()))
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
    p.add_argument("--trained-logit", type=float, default=10.0,
                   help="a trained model's largest logit per token, for bf16's rounding at that size")
    args = p.parse_args(argv)
    if args.dim % 4 or args.big_dim % 4:
        p.error("--dim and --big-dim must be multiples of 4 (the attention heads)")
    if not args.trained_logit > 0:
        p.error(f"--trained-logit must be a positive size, not {args.trained_logit}")
    torch.set_num_threads(1)
    with session(launch_hint=LAUNCH) as ctx:
        run(ctx, args)
    return 0


if __name__ == "__main__":
    run_main(main)
