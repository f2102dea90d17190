"""Resharding drill: an FSDP2-sharded model saved with DCP on 2 ranks, resumed on 1, then on 3.

    python -m source_code.resilience.reshard_drill --worlds 2,1,3

Each world is its own set of processes (as after a restart on another number of nodes): it
builds the model, shards it with ``fully_shard`` over its ranks (rank r of N holds rows
[r*c, (r+1)*c) of every weight and the Adam state of those rows), loads the previous world's
DCP checkpoint (each rank reads the rows of its new shard, whatever the old layout was), trains
its share of the epoch on its slice of each global batch (reshard.EpochPosition), and saves.
Checked per world: each rank's share of the parameters (1/N: the state was re-laid out), a
digest of the full model and optimizer state gathered right after the load against the one
gathered right before the previous world's save (equal: nothing lost or reordered), and at
the end every sample of the epoch trained exactly once and the loss of one process trained on
the same global batches without any restart.

``naive_resume`` counts what a per-rank sampler state would train instead (the negative control).
"""
from __future__ import annotations

import hashlib
import tempfile

import torch
import torch.distributed as dist

from source_code import processes
from source_code.cli import Parser, positive_int
from source_code.errors import LaunchError, run_main
from source_code.resilience import common, elastic_history, reshard


def _full_digest(model, optimizer) -> str:
    """SHA-256 of the full (unsharded) model and optimizer state, the same on every rank."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
    model_sd, optim_sd = get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True))
    h = hashlib.sha256()
    for name, t in sorted(model_sd.items()):
        h.update(name.encode() + t.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    for key, state in sorted(optim_sd["state"].items()):
        for k, v in sorted(state.items()):
            if torch.is_tensor(v):
                h.update(f"{key}.{k}".encode() + v.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _world(path_in: str, path_out: str, steps: int, batch_size: int, n_samples: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from source_code.sharding.fsdp import shard_model
    from source_code.measure import local
    world = dist.get_world_size()
    dataset = common.task(n_samples)
    model, _ = common.build(0)
    shard_model(model, init_device_mesh("cpu", (world,)))            # FSDP2: each block, then the root
    optimizer = torch.optim.Adam(model.parameters(), lr=common.LR)   # after sharding: shard states
    position = reshard.EpochPosition(len(dataset), batch_size)
    loaded = None
    if path_in:
        reshard.load(path_in, model, optimizer, position)            # re-laid out for this world
        loaded = _full_digest(model, optimizer)
    resumed_at = position.consumed
    seen = []
    for _ in range(steps or (len(dataset) // batch_size - position.consumed // batch_size)):
        seen += reshard.sharded_train_step(model, optimizer, position, dataset)
    share = sum(local(p).numel() for p in model.parameters()) / sum(p.numel() for p in model.parameters())
    saved = _full_digest(model, optimizer) if path_out else None
    if path_out:
        reshard.save(path_out, model, optimizer, position)
    final = None
    if not path_out:                                                 # the last world: the loss
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
        plain, _ = common.build(0)
        plain.load_state_dict(full)
        final = common.eval_loss(plain, dataset)
    return {"world": world, "share": share, "resumed_at": resumed_at, "seen": seen,
            "loaded_digest": loaded, "saved_digest": saved, "final_loss": final}


def drill(worlds=(2, 1, 3), steps=(3, 3), batch_size: int = 24, n_samples: int = 240, stream=None) -> dict:
    """Train ``steps[i]`` global steps on ``worlds[i]`` ranks, the last world the rest of the epoch."""
    check(worlds, steps, batch_size, n_samples)
    paths = [tempfile.mkdtemp(prefix=f"reshard_{i}_") for i in range(len(worlds) - 1)]
    runs = []
    for i, world in enumerate(worlds):
        out = processes.spawn(_world, world, paths[i - 1] if i else "", paths[i] if i < len(paths) else "",
                              steps[i] if i < len(steps) else 0, batch_size, n_samples,
                              device="cpu", stream=stream)
        runs.append({"world": world, "shares": [r["share"] for r in out], "resumed_at": out[0]["resumed_at"],
                     "seen": [i for r in out for i in r["seen"]], "loaded_digest": out[0]["loaded_digest"],
                     "saved_digest": out[0]["saved_digest"], "final_loss": out[0]["final_loss"],
                     "digests_agree": len({(r["loaded_digest"], r["saved_digest"]) for r in out}) == 1})
    seen = [i for r in runs for i in r["seen"]]
    return {"worlds": runs, "seen": len(seen), "unique": len(set(seen)),
            "expected": n_samples // batch_size * batch_size,
            "state_carried": all(a["saved_digest"] == b["loaded_digest"] for a, b in zip(runs, runs[1:])),
            "final_loss": runs[-1]["final_loss"], "reference_loss": elastic_history.reference_loss(n_samples, batch_size)}


def check(worlds, steps, batch_size: int, n_samples: int) -> None:
    if len(worlds) < 2 or len(steps) != len(worlds) - 1 or min(worlds) < 1 or min(steps) < 1:
        raise LaunchError("error: give two or more --worlds and one --steps value (>= 1) per world but the last")
    if any(batch_size % w for w in worlds):
        raise LaunchError(f"error: --batch-size {batch_size} must divide by every world size {list(worlds)}")
    if sum(steps) >= n_samples // batch_size:
        raise LaunchError("error: the --steps of the worlds before the last must stop inside the epoch "
                          f"({n_samples // batch_size} steps of --batch-size {batch_size})")


def naive_resume(n: int, batch_size: int, before: int, after: int, steps_before: int) -> dict:
    """The same change with a per-rank position: DistributedSampler shards, and each rank of the new
    world skips as many samples as a rank of the old one had yielded (a per-rank sampler state, as
    a data loader's state_dict keeps it). Counts what that trains on (the negative control)."""
    from torch.utils.data import DistributedSampler
    data = range(n)

    def shard(world, rank):
        return list(DistributedSampler(data, world, rank, shuffle=True, seed=0, drop_last=True))
    seen = [i for r in range(before) for i in shard(before, r)[:steps_before * (batch_size // before)]]
    done = steps_before * (batch_size // before)                 # what each old rank yielded
    seen += [i for r in range(after) for i in shard(after, r)[done:]]
    return {"seen": len(seen), "unique": len(set(seen)), "repeated": len(seen) - len(set(seen)),
            "skipped": n - len(set(seen))}


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise LaunchError(f"error: expected numbers separated by commas, got {text!r}") from None


def main(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--worlds", default="2,1,3", help="the world sizes, in order")
    p.add_argument("--steps", default="3,3", help="global steps of each world but the last")
    p.add_argument("--batch-size", type=positive_int, default=24)
    p.add_argument("--samples", type=positive_int, default=240, help="samples in the epoch")
    a = p.parse_args(argv)
    worlds, steps = _ints(a.worlds), _ints(a.steps)
    check(worlds, steps, a.batch_size, a.samples)
    r = drill(worlds, steps, a.batch_size, a.samples)
    shares = ",".join(f"{max(w['shares']):.3f}" for w in r["worlds"])
    print(f"summary: worlds={a.worlds} largest_share={shares} state_carried={int(r['state_carried'])} "
          f"seen={r['seen']} unique={r['unique']} expected={r['expected']} "
          f"loss_vs_one_process={abs(r['final_loss'] - r['reference_loss']):.1e} "
          f"exactly_once={int(r['seen'] == r['unique'] == r['expected'])}")
    return 0


if __name__ == "__main__":
    run_main(main)
