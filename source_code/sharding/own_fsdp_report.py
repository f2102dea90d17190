"""FSDP by hand (own_fsdp.py) against one process, torch's fully_shard, DDP, ZeRO-1 and ZeRO-2.

    torchrun --standalone --nproc-per-node=4 -m source_code.sharding.own_fsdp_report
    torchrun --standalone --nproc-per-node=4 -m source_code.sharding.own_fsdp_report --steps 8 --out own_fsdp.json

Every implementation trains the same TransformerLM (workload.py: same initial weights, same
global batches of the sort task, each rank on its B/N samples) with AdamW for --steps steps;
own FSDP and fully_shard also in bf16 mixed precision (own_fsdp_mixed.py; MixedPrecisionPolicy
with param_dtype bf16, reduce_dtype and output_dtype fp32) and in fp64. Rank 0 trains the
one-process reference on the same global batches, split into the same N slices whose
gradients it adds up (sharding/parity.py), in fp32 and in fp64. In fp32 the N ranks' gradients
are added in another order than the reference adds them (gloo's reduce-scatter, FSDP2's), so the
weights differ in the last bits and Adam carries that on: reported, not checked. In fp64 the
same code must land within --tol of the fp64 reference: that is the check. Printed, rank 0:

    parity: impl=own_fsdp_fp64 world_size=N steps=S max_abs_diff=D max_ulps=U bitwise=True|False worst=NAME
            (and own_fsdp, fully_shard in fp32 and fp64, own_fsdp against fully_shard; own_fsdp_bf16
            against fully_shard_bf16, and against own_fsdp in fp32)
    bytes: impl=ddp resident=B gathered=G peak=P backward_peak=K   (per rank, one line each)
    timeline: ...    (own_fsdp_timeline.py: a step serial and overlapped, measured here)
    predicted: ...   (own_fsdp_predict.py: the same on a GPU node, and at width 4096)
    summary: world_size=N device=D ... own_fsdp_max_abs_diff=D own_fsdp_state_ratio=R own_fsdp_backward_peak_ratio=K
                                                     prefetch_backward_peak_ratio=KP

Bytes (own_fsdp_memory.py), per rank, counted from storages: resident, what block 0's forward
gathers on top (peak = resident + gathered), and the backward peak (own FSDP, fully_shard, DDP).
R = own FSDP's resident / DDP's, K = own FSDP's backward peak / DDP's, KP the same with
prefetch (own_fsdp_prefetch.py, counted in the timeline run: a second unit full). The collectives of the
counted step (measure.CommCounter) go to the JSON as "comm": {impl: {kind: payload bytes}}: bf16
halves the all-gathers' bytes. Exit 1 when D > --tol. --out writes every number as JSON (rank 0).
"""
from __future__ import annotations

import contextlib
import json

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.parallel import DistributedDataParallel as DDP

from source_code import workload
from source_code.cli import Parser, positive_float, positive_int, writable_path
from source_code.distributed import print0, ranks_from_env, run_main, session
from source_code.errors import LaunchError
from source_code.measure import CommCounter
from source_code.sharding import own_fsdp, own_fsdp_mixed, own_fsdp_predict
from source_code.sharding import own_fsdp_timeline as timeline
from source_code.sharding.fsdp import MixedPrecisionPolicy, build_sharded, shard_model, unsharded_parameter_bytes
from source_code.sharding.own_fsdp_memory import BackwardPeak, FSDP2BackwardPeak, measure_bytes
from source_code.sharding.parity import full_weights, train
from source_code.sharding.zero import ZeroAdamW

LAUNCH = "torchrun --standalone --nproc-per-node=4 -m source_code.sharding.own_fsdp_report"
IMPLS = ("ddp", "zero1", "zero2", "own_fsdp", "fully_shard", "own_fsdp_bf16", "fully_shard_bf16",
         "own_fsdp_fp64", "fully_shard_fp64")
PEAKS = ("ddp", "own_fsdp", "own_fsdp_bf16", "fully_shard", "fully_shard_bf16")   # backward peak counted
WIDE = workload.model_config(dim=4096, n_layers=2, n_heads=32, vocab_size=32000, max_len=4096)
# bf16 mixed precision: FSDP2's policy, and own_fsdp_mixed.py doing the same by hand
BF16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                            output_dtype=torch.float32)


def build(impl: str, cfg: dict, ctx, args):
    """(model, optimizer, the module whose parameters to compare, gathered-bytes function)."""
    opt_kw = {"lr": args.lr, "weight_decay": 0.01}
    if impl.startswith("fully_shard"):
        mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
        if impl.endswith("fp64"):       # the same weights, exactly, in fp64 (then sharded)
            model = shard_model(workload.build_model(cfg, args.seed, ctx.device).double(), mesh)
        else:
            mp = {"mp_policy": BF16} if impl.endswith("bf16") else {}
            model = build_sharded(cfg, mesh, args.seed, ctx.device, meta=True, **mp)
        return model, torch.optim.AdamW(model.parameters(), **opt_kw), model, \
            lambda: unsharded_parameter_bytes(model)
    model = workload.build_model(cfg, args.seed, ctx.device)
    if impl.endswith("fp64"):
        model = model.double()
    if impl.startswith("own_fsdp"):
        units = (own_fsdp_mixed.shard_mixed if impl.endswith("bf16") else own_fsdp.shard_by_hand)(model)
        return model, torch.optim.AdamW(model.parameters(), **opt_kw), model, \
            lambda: sum(u.gathered_bytes() for u in units)
    if impl == "ddp":
        ddp = DDP(model, device_ids=ctx.device_ids)
        return ddp, torch.optim.AdamW(ddp.parameters(), **opt_kw), model, lambda: 0
    return model, ZeroAdamW(model, stage=int(impl[-1]), **opt_kw), model, lambda: 0


def weights(impl: str, inner) -> dict:
    """{name: full tensor} on every rank (collective for the sharded implementations)."""
    if impl.startswith("own_fsdp"):
        return {k: v.cpu() for k, v in own_fsdp.full_state_dict(inner).items()}
    return dict(zip([n for n, _ in inner.named_parameters()], full_weights(inner)))


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys(), f"parameter names differ: {sorted(a.keys() ^ b.keys())}"
    return max((a[k] - b[k]).abs().max().item() for k in a)


def max_ulps(a: dict, b: dict) -> float:
    """The largest difference of a tensor, in units of the last place (of b's dtype) of that
    tensor's largest weight: how many roundings apart, whatever the weights' scale."""
    def ulp(t):
        top = t.abs().max()
        return (torch.nextafter(top, top.new_tensor(float("inf"))) - top).item()
    return max((a[k] - b[k]).abs().max().item() / ulp(b[k]) for k in a)


def counted_step(impl, model, opt, inner, batch, ctx) -> tuple[dict, dict]:
    """One more backward + step after training, so the gradients exist when counted: the
    collectives of that step by kind, and (PEAKS) its backward peak with its parts."""
    peak = FSDP2BackwardPeak(inner, opt) if impl.startswith("fully_shard") else BackwardPeak(model, opt, inner)
    counter = CommCounter(ctx.world_size)
    with counter:
        with peak if impl in PEAKS else contextlib.nullcontext():
            workload.loss_fn(model, *(t.to(ctx.device) for t in batch)).backward()
        opt.step()
    peaks = {"backward_peak": peak.peak, "backward_parts": peak.parts, "at_units": peak.at_units} if impl in PEAKS else {}
    return dict(counter.payload), peaks


def parameters_of(block) -> list:
    """(name, local shape, what it is) of a block's parameters: a flat shard or DTensor shards."""
    return [(n, list(p.to_local().shape if hasattr(p, "to_local") else p.shape),
             str(getattr(p, "placements", "")) or ("flat shard" if n.endswith("flat_shard") else "whole"))
            for n, p in block.named_parameters()]


def run(ctx, args) -> dict:
    cfg = workload.model_config(dim=args.dim, n_layers=args.layers)
    dataset = workload.sort_task(n=512)
    reference = {}
    if ctx.is_main:
        for dtype in (torch.float32, torch.float64):
            ref = workload.build_model(cfg, args.seed, ctx.device).to(dtype)
            ref_opt = torch.optim.AdamW(ref.parameters(), lr=args.lr, weight_decay=0.01)
            train(ref, ref_opt, dataset, args, 0, 1, ctx.device, split=ctx.world_size)
            reference[dtype] = weights("reference", ref)
    x, _ = workload.rank_slice(workload.global_batch(dataset, 0, args.batch_size, args.seed),
                               ctx.rank, ctx.world_size)
    batch = workload.rank_slice(workload.global_batch(dataset, args.steps, args.batch_size, args.seed),
                                ctx.rank, ctx.world_size)
    res = {"world_size": ctx.world_size, "steps": args.steps, "device": ctx.device.type,
           "parity": {}, "bytes": {}, "comm": {}, "parameters": {}}
    got = {}
    for impl in IMPLS:
        model, opt, inner, gathered = build(impl, cfg, ctx, args)
        train(model, opt, dataset, args, ctx.rank, ctx.world_size, ctx.device)
        if impl not in ("ddp", "zero1", "zero2"):
            got[impl] = weights(impl, inner)
        if impl in ("own_fsdp", "fully_shard"):
            res["parameters"][impl] = parameters_of(inner.layers[0])
        if impl == "own_fsdp":
            res["units"] = [u.name for u in inner.own_fsdp_units]
            res["replicated"] = own_fsdp.replicated_names(inner)
        res["comm"][impl], peaks = counted_step(impl, model, opt, inner, batch, ctx)
        if impl.endswith("fp64"):
            continue                                    # parity only: the bytes are fp32's twice
        b = res["bytes"][impl] = {**measure_bytes(model, opt, inner, gathered, x.to(ctx.device)), **peaks}
        print0(f"bytes: impl={impl} world_size={ctx.world_size} resident={b['resident']} "
               f"gathered={b['gathered']} peak={b['peak']} backward_peak={b.get('backward_peak', '-')}")
        del model, opt, inner, gathered
    res["timeline"] = timeline.timeline_run(ctx, cfg, args)
    if ctx.is_main:
        tl = res["timeline"]
        print0("timeline: " + " ".join(
            f"{k} forward_ms={tl[k]['forward_ms']:.1f} backward_ms={tl[k]['backward_ms']:.1f} "
            f"hidden_forward={tl[k]['hidden']['forward']:.2f} hidden_backward={tl[k]['hidden']['backward']:.2f}"
            for k in ("serial", "overlapped")))
        res["predicted"] = {"this_model": own_fsdp_predict.predict(cfg, tl["batch"], tl["seq"], ctx.world_size),
                            "dim4096": own_fsdp_predict.predict(WIDE, 4, 4096, ctx.world_size)}
        for k, p in res["predicted"].items():
            print0(f"predicted: {k} step_ms serial={1e3 * p['serial']['step_s']:.3f} "
                   f"overlapped={1e3 * p['overlap']['step_s']:.3f} hidden={p['overlap']['hidden_fraction']:.2f} "
                   f"exposed_forward={','.join(p['exposed_forward'])}")
        ref32, ref64 = reference[torch.float32], reference[torch.float64]
        for name, a, b in (("own_fsdp_fp64", got["own_fsdp_fp64"], ref64),
                           ("fully_shard_fp64", got["fully_shard_fp64"], ref64),
                           ("own_fsdp", got["own_fsdp"], ref32),
                           ("fully_shard", got["fully_shard"], ref32),
                           ("own_fsdp_vs_fully_shard", got["own_fsdp"], got["fully_shard"]),
                           ("own_fsdp_bf16_vs_fully_shard_bf16", got["own_fsdp_bf16"], got["fully_shard_bf16"]),
                           ("own_fsdp_bf16_vs_own_fsdp", got["own_fsdp_bf16"], got["own_fsdp"])):
            d, ulps = max_diff(a, b), max_ulps(a, b)
            bitwise = all(torch.equal(a[k], b[k]) for k in a)
            worst = max(a, key=lambda k: (a[k] - b[k]).abs().max().item())   # the tensor holding d
            res["parity"][name] = {"max_abs_diff": d, "bitwise": bitwise, "max_ulps": ulps, "worst": worst}
            print0(f"parity: impl={name} world_size={ctx.world_size} steps={args.steps} "
                   f"max_abs_diff={d:.3g} max_ulps={ulps:.3g} bitwise={bitwise} worst={worst}")
        counted = res["bytes"]
        res["state_ratio"] = counted["own_fsdp"]["resident"] / counted["ddp"]["resident"]
        res["backward_peak_ratio"] = counted["own_fsdp"]["backward_peak"] / counted["ddp"]["backward_peak"]
        res["prefetch_backward_peak_ratio"] = tl["overlapped"]["backward_peak"] / counted["ddp"]["backward_peak"]
    dist.barrier()
    return res


def run_here(flags: dict) -> dict:
    """``run`` inside processes.spawn: ``flags`` ({"dim": 20, ...}) over the entry point's defaults."""
    from source_code.distributed import context
    ctx = context()
    args = parser().parse_args([])
    vars(args).update(flags)
    check(args, ctx.world_size)
    return run(ctx, args)


def parser() -> Parser:
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=positive_int, default=3)
    p.add_argument("--batch-size", type=positive_int, default=16, help="global batch (divisible by N)")
    p.add_argument("--lr", type=positive_float, default=3e-3)
    p.add_argument("--dim", type=positive_int, default=64)
    p.add_argument("--layers", type=positive_int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tol", type=positive_float, default=1e-12,
                   help="largest |difference| of own FSDP's weights from one process, both in fp64")
    p.add_argument("--out", type=writable_path, default="", help="write the results here (JSON, rank 0)")
    return p


def check(args, world: int) -> None:
    """What the flag types cannot say alone, before any process group: one line naming the fix."""
    if args.dim % 4:
        raise LaunchError(f"error: --dim {args.dim} must be a multiple of 4 (the attention heads)")
    if args.batch_size % world:
        raise LaunchError(f"error: --batch-size {args.batch_size} does not divide among {world} "
                          f"processes; use a multiple of {world}")


def parse_args(argv=None):
    args = parser().parse_args(argv)
    found = ranks_from_env()
    check(args, found[2] if found else 1)
    return args


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(1)
    with session(launch_hint=LAUNCH, allow_single=True) as ctx:
        res = run(ctx, args)
    if res.get("parity") is None or not res["parity"]:
        return 0
    par = res["parity"]
    d = par["own_fsdp_fp64"]["max_abs_diff"]
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    print(f"summary: world_size={res['world_size']} device={res['device']} steps={res['steps']} "
          f"units={len(res['units'])} replicated={len(res['replicated'])} "
          f"fully_shard_max_abs_diff={par['fully_shard_fp64']['max_abs_diff']:.3g} "
          f"fully_shard_fp32_max_abs_diff={par['fully_shard']['max_abs_diff']:.3g} "
          f"bf16_vs_fully_shard_bf16={par['own_fsdp_bf16_vs_fully_shard_bf16']['max_abs_diff']:.3g} "
          f"own_fsdp_fp32_max_abs_diff={par['own_fsdp']['max_abs_diff']:.3g} "
          f"own_fsdp_max_abs_diff={d:.3g} own_fsdp_state_ratio={res['state_ratio']:.4f} "
          f"own_fsdp_backward_peak_ratio={res['backward_peak_ratio']:.4f} "
          f"prefetch_backward_peak_ratio={res['prefetch_backward_peak_ratio']:.4f}")
    if d > args.tol:
        print(f"FAILED: own_fsdp_max_abs_diff {d:.3g} (fp64) > tol {args.tol:g}")
        return 1
    return 0


if __name__ == "__main__":
    run_main(main)
