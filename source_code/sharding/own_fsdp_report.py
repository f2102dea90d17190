"""FSDP by hand (own_fsdp.py) against one process, torch's fully_shard, DDP, ZeRO-1 and ZeRO-2.

    torchrun --standalone --nproc-per-node=4 -m source_code.sharding.own_fsdp_report
    torchrun --standalone --nproc-per-node=4 -m source_code.sharding.own_fsdp_report --steps 8 --out own_fsdp.json

Every implementation trains the same TransformerLM (workload.py: same initial weights, same
global batches of the sort task, each rank on its B/N samples) with AdamW for --steps steps,
own FSDP and fully_shard also in bf16 mixed precision (own_fsdp_mixed.py; MixedPrecisionPolicy
with param_dtype bf16, reduce_dtype and output_dtype fp32);
rank 0 also trains the one-process reference on the same global batches, split into the same
N slices whose gradients it adds up (sharding/parity.py). Printed, rank 0:

    parity: impl=own_fsdp world_size=N steps=S max_abs_diff=D bitwise=True|False
    parity: impl=fully_shard ...     (and own_fsdp against fully_shard; own_fsdp_bf16 against
            fully_shard_bf16, and against own_fsdp in fp32)
    bytes: impl=ddp resident=B gathered=G peak=P      (per rank, one line per implementation)
    prefetch: forward_ms none=.. prefetch=.. hidden none=.. prefetch=..   (own_fsdp_timeline.py)
    summary: world_size=N device=D ... bf16_vs_fully_shard_bf16=M own_fsdp_max_abs_diff=D own_fsdp_state_ratio=R

resident: parameters + gradients + optimizer state this rank holds after a step (before
zero_grad): what stays between layers (measure.state_bytes; own FSDP's full buffers counted
too, 0 bytes then). gathered: full parameters that exist on top of that while one unit (block
0) computes its forward, counted inside its forward; peak = resident + gathered. R = own FSDP's
resident / DDP's. The collectives of the counted step (measure.CommCounter) go to the JSON as
"comm": {impl: {kind: payload bytes}}: bf16 halves the all-gathers' bytes. Exit 1 when D > --tol. --out writes every number as JSON (rank 0).
"""
from __future__ import annotations

import json

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.parallel import DistributedDataParallel as DDP

from source_code import workload
from source_code.cli import Parser, positive_float, positive_int, writable_path
from source_code.distributed import print0, ranks_from_env, run_main, session
from source_code.errors import LaunchError
from source_code.measure import CommCounter, state_bytes
from source_code.sharding import own_fsdp, own_fsdp_mixed
from source_code.sharding import own_fsdp_timeline as timeline
from source_code.sharding.fsdp import MixedPrecisionPolicy, build_sharded, unsharded_parameter_bytes
from source_code.sharding.parity import full_weights, train
from source_code.sharding.zero import ZeroAdamW

LAUNCH = "torchrun --standalone --nproc-per-node=4 -m source_code.sharding.own_fsdp_report"
IMPLS = ("ddp", "zero1", "zero2", "own_fsdp", "fully_shard", "own_fsdp_bf16", "fully_shard_bf16")
# bf16 mixed precision: FSDP2's policy, and own_fsdp_mixed.py doing the same by hand
BF16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                            output_dtype=torch.float32)


def build(impl: str, cfg: dict, ctx, args):
    """(model, optimizer, the module whose parameters to compare, gathered-bytes function)."""
    opt_kw = {"lr": args.lr, "weight_decay": 0.01}
    if impl.startswith("fully_shard"):
        mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
        mp = {"mp_policy": BF16} if impl.endswith("bf16") else {}
        model = build_sharded(cfg, mesh, args.seed, ctx.device, meta=True, **mp)
        return model, torch.optim.AdamW(model.parameters(), **opt_kw), model, \
            lambda: unsharded_parameter_bytes(model)
    model = workload.build_model(cfg, args.seed, ctx.device)
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


def measure_bytes(model, opt, inner, gathered, x) -> dict:
    """Resident state after the step, and what a unit's forward gathers on top (block 0)."""
    extra = [u.full for u in getattr(inner, "own_fsdp_units", [])]
    resident = state_bytes(model, opt, extra_params=extra)["total"]
    seen = []
    probe = inner.layers[0].register_forward_pre_hook(lambda m, a: seen.append(gathered()))
    with torch.no_grad():
        model(x)                        # one forward: the hooks gather and free as in training
    probe.remove()
    after = state_bytes(model, opt, extra_params=extra)["total"]
    assert after == resident, f"{after} bytes resident after the forward, {resident} before"
    return {"resident": resident, "gathered": seen[0], "peak": resident + seen[0]}


def run(ctx, args) -> dict:
    cfg = workload.model_config(dim=args.dim, n_layers=args.layers)
    dataset = workload.sort_task(n=512)
    reference = None
    if ctx.is_main:
        ref = workload.build_model(cfg, args.seed, ctx.device)
        ref_opt = torch.optim.AdamW(ref.parameters(), lr=args.lr, weight_decay=0.01)
        train(ref, ref_opt, dataset, args, 0, 1, ctx.device, split=ctx.world_size)
        reference = weights("reference", ref)
    x, _ = workload.rank_slice(workload.global_batch(dataset, 0, args.batch_size, args.seed),
                               ctx.rank, ctx.world_size)
    res = {"world_size": ctx.world_size, "steps": args.steps, "device": ctx.device.type,
           "parity": {}, "bytes": {}, "comm": {}}
    got = {}
    for impl in IMPLS:
        model, opt, inner, gathered = build(impl, cfg, ctx, args)
        train(model, opt, dataset, args, ctx.rank, ctx.world_size, ctx.device)
        if impl not in ("ddp", "zero1", "zero2"):
            got[impl] = weights(impl, inner)
        if impl == "own_fsdp":
            res["units"] = [u.name for u in inner.own_fsdp_units]
            res["replicated"] = own_fsdp.replicated_names(inner)
        # train() ends with zero_grad: one more backward + step so the gradients exist when counted
        bx, by = workload.rank_slice(workload.global_batch(dataset, args.steps, args.batch_size,
                                                           args.seed), ctx.rank, ctx.world_size)
        counter = CommCounter(ctx.world_size)          # the collectives of that step, by kind
        with counter:
            workload.loss_fn(model, bx.to(ctx.device), by.to(ctx.device)).backward()
            opt.step()
        res["comm"][impl] = dict(counter.payload)
        res["bytes"][impl] = measure_bytes(model, opt, inner, gathered, x.to(ctx.device))
        b = res["bytes"][impl]
        print0(f"bytes: impl={impl} world_size={ctx.world_size} resident={b['resident']} "
               f"gathered={b['gathered']} peak={b['peak']}")
        del model, opt, inner, gathered
    res["prefetch"] = timeline.timeline_run(ctx, cfg, args)
    if ctx.is_main:
        pf = res["prefetch"]
        print0(f"prefetch: forward_ms none={pf['none']['forward_ms']:.1f} "
               f"prefetch={pf['prefetch']['forward_ms']:.1f} hidden none={pf['none']['hidden_fraction']:.2f} "
               f"prefetch={pf['prefetch']['hidden_fraction']:.2f}")
        big = workload.model_config(dim=4096, n_layers=2, n_heads=32, vocab_size=32000, max_len=4096)
        res["predicted"] = {
            "this_model": timeline.predict(pf["unit_bytes"], pf["unit_params"], pf["tokens"], ctx.world_size),
            "dim4096": timeline.predict(*timeline.unit_sizes(big, ctx.world_size), 4 * 4096, ctx.world_size)}
        for name, a, b in (("own_fsdp", got["own_fsdp"], reference),
                           ("fully_shard", got["fully_shard"], reference),
                           ("own_fsdp_vs_fully_shard", got["own_fsdp"], got["fully_shard"]),
                           ("own_fsdp_bf16_vs_fully_shard_bf16", got["own_fsdp_bf16"], got["fully_shard_bf16"]),
                           ("own_fsdp_bf16_vs_own_fsdp", got["own_fsdp_bf16"], got["own_fsdp"])):
            d = max_diff(a, b)
            bitwise = all(torch.equal(a[k], b[k]) for k in a)
            res["parity"][name] = {"max_abs_diff": d, "bitwise": bitwise}
            print0(f"parity: impl={name} world_size={ctx.world_size} steps={args.steps} "
                   f"max_abs_diff={d:.3g} bitwise={bitwise}")
        res["state_ratio"] = res["bytes"]["own_fsdp"]["resident"] / res["bytes"]["ddp"]["resident"]
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
    p.add_argument("--tol", type=positive_float, default=1e-6)
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
    d, r = res["parity"]["own_fsdp"]["max_abs_diff"], res["state_ratio"]
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    print(f"summary: world_size={res['world_size']} device={res['device']} steps={res['steps']} units={len(res['units'])} "
          f"replicated={len(res['replicated'])} "
          f"fully_shard_max_abs_diff={res['parity']['fully_shard']['max_abs_diff']:.3g} "
          f"bf16_vs_fully_shard_bf16={res['parity']['own_fsdp_bf16_vs_fully_shard_bf16']['max_abs_diff']:.3g} "
          f"own_fsdp_max_abs_diff={d:.3g} own_fsdp_state_ratio={r:.4f}")
    if d > args.tol:
        print(f"FAILED: own_fsdp_max_abs_diff {d:.3g} > tol {args.tol:g}")
        return 1
    return 0


if __name__ == "__main__":
    run_main(main)
