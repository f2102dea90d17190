"""Load a sharded (DCP) checkpoint on any number of ranks and compare it with the full state.

    torchrun --standalone --nproc-per-node=2 -m source_code.sharding.train --epochs 1 --checkpoint ckpt --export full.pt
    torchrun --standalone --nproc-per-node=4 -m source_code.sharding.dcp_demo --checkpoint ckpt --full full.pt
    python -m source_code.sharding.dcp_demo --checkpoint ckpt --full full.pt        # 1 process

The model and optimizer are built for *this* run's number of ranks (FSDP2, sharded per block),
the newest checkpoint is loaded into them (DCP reads the pieces each new shard needs), and
the full, unsharded state gathered on rank 0 is compared with ``--full`` (written by the
saving run with ``--export``). Printed:

    dcp: saved_by=2 loaded_on=4 local_fraction=0.250 model_max_abs_diff=0 optim_max_abs_diff=0
"""
from __future__ import annotations

import argparse

import torch
from torch.distributed.device_mesh import init_device_mesh

from source_code.distributed import LaunchError, print0, run_main, session
from source_code.sharding import checkpointing
from source_code.sharding.fsdp import build_sharded
from source_code.measure import local

LAUNCH = "torchrun --standalone --nproc-per-node=4 -m source_code.sharding.dcp_demo --checkpoint DIR"


def max_diff(a: dict, b: dict) -> float:
    fa, fb = checkpointing.flat_tensors(a), checkpointing.flat_tensors(b)
    if fa.keys() != fb.keys():
        raise AssertionError(f"different keys: {sorted(fa.keys() ^ fb.keys())[:3]}")
    return max(((x.float() - fb[k].float()).abs().max().item() for k, x in fa.items()), default=0.0)


def run(ctx, args, progress) -> dict:
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    model = build_sharded(progress["config"], mesh, seed=12345, device=ctx.device, meta=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1.0)   # lr and state come from the checkpoint
    checkpointing.load(args.checkpoint, model, opt)
    mine = sum(local(p).numel() for p in model.parameters())
    total = sum(p.numel() for p in model.parameters())
    full_model = checkpointing.full_model_state(model)
    full_optim = checkpointing.full_optimizer_state(model, opt)
    result = {"saved_by": progress["world_size"], "loaded_on": ctx.world_size,
              "local_fraction": mine / total}
    if args.full and ctx.is_main:
        want = torch.load(args.full, map_location="cpu", weights_only=False)
        result["model_max_abs_diff"] = max_diff(full_model, want["model"])
        result["optim_max_abs_diff"] = max_diff(full_optim["state"], want["optim"]["state"])
    print0("dcp: " + " ".join(f"{k}={v:.3f}" if isinstance(v, float) and k == "local_fraction"
                              else f"{k}={v:g}" for k, v in result.items()))
    return result


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True, help="directory written by train.py --checkpoint")
    p.add_argument("--full", default="", help="full state dicts written by train.py --export")
    args = p.parse_args(argv)
    progress = checkpointing.read_progress(args.checkpoint)
    if progress is None:
        raise LaunchError(f"error: no checkpoint under {args.checkpoint}; write one with "
                          "torchrun ... -m source_code.sharding.train --checkpoint DIR")
    torch.set_num_threads(1)
    with session(launch_hint=LAUNCH, allow_single=True) as ctx:
        result = run(ctx, args, progress)
    bad = [k for k in ("model_max_abs_diff", "optim_max_abs_diff") if result.get(k, 0) != 0]
    return 1 if bad else 0


if __name__ == "__main__":
    run_main(main)
