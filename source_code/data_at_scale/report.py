"""Notebook 20 in one run: file layouts counted, staging, uneven shards, resume on another world
size, the loaders' resume, shuffles; ending with the ``summary:`` line.

    python -m source_code.data_at_scale.report                 # about a minute on 2 CPU cores
    python -m source_code.data_at_scale.report --samples 12100 --per-shard 1280

Each function here runs one part and returns its numbers; the notebook calls them one by one
(each once) and ``summary_line`` gathers what they found. The multi-process parts start their
ranks with ``processes.spawn`` (gloo on the CPU: the lessons are about data, not devices).
"""
from __future__ import annotations

import os
import tarfile
import tempfile
import time
from pathlib import Path

from source_code import processes
from source_code.cli import Parser, positive_float, positive_int
from source_code.errors import LaunchError, run_main
from source_code.data_at_scale import cursor as cur, drills, formats, fsops, samplers, shuffling, staging

WORLD, RESUME_WORLD = 4, 3          # the drills' world sizes
LOCAL_BATCH, GLOBAL_BATCH, STOP_AFTER = 16, 48, 9


def prepare(root, n: int = 1210, per_shard: int = 128) -> dict:
    """The sort task's samples written in the four layouts under ``root`` (the "shared" copy)."""
    samples = formats.make_samples(n)
    paths = formats.write_all(samples, Path(root) / "shared", per_shard)
    shards = [list(range(s, min(s + per_shard, n))) for s in range(0, n, per_shard)]
    return {"root": str(root), "samples": samples, "paths": paths, "urls": paths["shards"],
            "shards": shards, "held_out": formats.make_samples(256, seed=1)}


def layouts(prep: dict) -> list[dict]:
    """One epoch of each layout from the shared copy: requests, bytes, CPU, and time on Lustre."""
    sources = {"loose": str(prep["paths"]["loose"]), "shards": prep["urls"],
               "array": str(prep["paths"]["array"]), "arrow": str(prep["paths"]["arrow"])}
    rows = []
    for name, reader in formats.READERS.items():
        row = fsops.epoch(reader, sources[name], Path(prep["root"]) / "shared")
        rows.append({"layout": name, **row, "lustre_s": fsops.on_shared(row),
                     "wait_s": fsops.waiting(row["requests"], row["bytes"])})
    return rows


def waits_by_sample_size(prep: dict, rows: list[dict], sizes=(10_000, 100_000)) -> list[dict]:
    """The same epoch's counted requests with samples of ``sizes`` bytes: the loose files hold
    ``size`` bytes each, the shards what WebDataset's ShardWriter writes per sample of that size
    (one shard of the run's shard size written here and measured). Lustre's waiting, modelled."""
    import numpy as np
    by = {row["layout"]: row for row in rows}
    n, per_shard = len(prep["samples"]), len(prep["shards"][0])
    out = [{"sample_bytes": formats.SEQ_BYTES, "shard_bytes": by["shards"]["bytes"] / n,
            "loose_s": by["loose"]["wait_s"], "shards_s": by["shards"]["wait_s"]}]
    for size in sizes:
        probe = Path(prep["root"]) / f"probe-{size}"
        urls = formats.write_shards(np.zeros((per_shard, size), np.uint8), probe, per_shard)
        per_sample = sum(os.path.getsize(u) for u in urls) / per_shard
        out.append({"sample_bytes": size, "shard_bytes": per_sample,
                    "loose_s": fsops.waiting(by["loose"]["requests"], n * size),
                    "shards_s": fsops.waiting(by["shards"]["requests"], n * per_sample)})
    return out


def staging_costs(prep: dict, nodes: int = 2) -> list[dict]:
    """Shards and loose files copied to a node-local directory: the copy against what it saves.

    All in the model of fsops and staging: the copy is its counted requests and bytes on Lustre
    and the node-local writes; an epoch saves its waiting for Lustre less the node-local reads.
    CPU time is left out of both sides (the reading's is the same staged or not); the copy's,
    measured here, is reported apart (``copy_cpu_s``). On ``nodes`` nodes every node copies all
    the files but reads only its share of an epoch (node 0's share counted: whole shards
    0, nodes, ... as split_by_node deals them, every nodes-th loose file as a split by sample
    does): ``node_break_even`` is the copy against that share. Segmented, node 0 copies only its
    share (counted the same way): ``part_break_even``."""
    rows = []
    for layout, reader, src in (("shards", formats.read_shards, Path(prep["urls"][0]).parent),
                                ("loose", formats.read_loose, prep["paths"]["loose"])):
        dst = Path(prep["root"]) / "node-local" / layout
        with fsops.counting(src) as ops:
            cpu = time.process_time()
            copy = staging.stage(src, dst)
            cpu = time.process_time() - cpu
        source = formats.shard_urls(src) if layout == "shards" else str(src)
        epoch = fsops.epoch(reader, source, src)
        # the model only: the copy's counted requests and bytes on Lustre and its local writes;
        # its CPU time, measured on this machine, is reported apart and not in the break-even
        copy_s = fsops.waiting(ops.total, copy["bytes"]) + copy["bytes"] / staging.LOCAL_WRITE_BYTES_S
        shared_s = fsops.waiting(epoch["requests"], epoch["bytes"])        # beyond the reading's own CPU
        local_s = epoch["bytes"] / staging.LOCAL_READ_BYTES_S
        share = (formats.shard_urls(src)[0::nodes] if layout == "shards"
                 else sorted(str(p) for p in Path(src).glob("*.bin"))[0::nodes])
        node = fsops.epoch(formats.read_shards if layout == "shards" else _read_files, share, src)
        node_shared_s = fsops.waiting(node["requests"], node["bytes"])
        node_local_s = node["bytes"] / staging.LOCAL_READ_BYTES_S
        with fsops.counting(src) as part_ops:     # segmented: node 0 copies only the files it reads
            part_cpu = time.process_time()
            part = staging.stage(src, Path(prep["root"]) / "node-local-part" / layout,
                                 names=[Path(p).name for p in share])
            part_cpu = time.process_time() - part_cpu
        part_copy_s = (fsops.waiting(part_ops.total, part["bytes"])
                       + part["bytes"] / staging.LOCAL_WRITE_BYTES_S)
        rows.append({"layout": layout, "files": copy["files"], "bytes": copy["bytes"],
                     "nodes": nodes, "node_requests": node["requests"], "node_bytes": node["bytes"],
                     "node_shared_s": node_shared_s,
                     "node_break_even": staging.break_even(copy_s, node_shared_s, node_local_s),
                     "part_requests": part_ops.total, "part_bytes": part["bytes"],
                     "part_break_even": staging.break_even(part_copy_s, node_shared_s, node_local_s),
                     "copy_requests": ops.total, "epoch_requests": epoch["requests"],
                     "epoch_bytes": epoch["bytes"], "copy_s": copy_s,
                     "copy_cpu_s": cpu, "part_cpu_s": part_cpu,
                     **(_one_archive(prep, src, shared_s, local_s) if layout == "loose" else {}),
                     "shared_s": shared_s, "local_s": local_s,
                     "break_even": staging.break_even(copy_s, shared_s, local_s)})
    return rows


def _one_archive(prep: dict, src, shared_s: float, local_s: float) -> dict:
    """CSC's pattern for loose files: one tar of them on the shared side, copied (one open) and
    unpacked on the node's own disk; the unpacking's opens are local, not counted on Lustre."""
    archive = Path(prep["root"]) / "archive"
    archive.mkdir(exist_ok=True)
    with tarfile.open(archive / "loose.tar", "w") as tar:
        for path in sorted(Path(src).glob("*.bin")):
            tar.add(path, arcname=path.name)
    with fsops.counting(archive) as ops:
        copy = staging.stage(archive, Path(prep["root"]) / "node-local-archive")
    with tarfile.open(Path(copy["dir"]) / "loose.tar") as tar:
        tar.extractall(Path(copy["dir"]) / "loose", **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    copy_s = fsops.waiting(ops.total, copy["bytes"]) + copy["bytes"] / staging.LOCAL_WRITE_BYTES_S
    return {"archive_requests": ops.total, "archive_bytes": copy["bytes"], "archive_copy_s": copy_s,
            "archive_files": len(list((Path(copy["dir"]) / "loose").glob("*.bin"))),
            "archive_break_even": staging.break_even(copy_s, shared_s, local_s)}


def _read_files(paths):
    """(id, bytes) of the loose files named, one open each (a node's share of a split by sample)."""
    for path in paths:
        with open(path, "rb") as f:
            yield int(Path(path).name[:6]), f.read()


def splits(n: int, shards: list[list[int]], world: int = WORLD, batch: int = LOCAL_BATCH) -> list[dict]:
    """Each way to split an epoch over ``world`` ranks: samples and steps per rank, and its cost."""
    from torch.utils.data import DistributedSampler
    order = list(range(n))
    ways = {"by shard (split_by_node)": [cur.by_shard(shards, r, world) for r in range(world)],
            "by sample": [cur.by_sample(order, r, world) for r in range(world)],
            "by sample, drop to equal": [cur.by_sample(order, r, world, fix="drop") for r in range(world)],
            "by sample, pad to equal": [cur.by_sample(order, r, world, fix="pad") for r in range(world)],
            "DistributedSampler": [list(DistributedSampler(order, world, r, shuffle=False)) for r in range(world)],
            "DistributedSampler(drop_last)": [list(DistributedSampler(order, world, r, shuffle=False, drop_last=True))
                                              for r in range(world)]}
    rows = []
    for name, per_rank in ways.items():
        c = drills.count([i for ids in per_rank for i in ids if i != cur.PAD], n)
        rows.append({"split": name, "samples": [len(ids) for ids in per_rank],
                     "steps": [cur.steps(ids, batch) for ids in per_rank], "dropped": c["missing"],
                     "pads": sum(ids.count(cur.PAD) for ids in per_rank), "repeated": c["repeated"]})
    return rows


def hang_drill(prep: dict, timeout_s: float = 3.0) -> list[dict]:
    """Whole shards per rank under plain DDP, on WORLD ranks with a short collective timeout.
    Run once more, with a timeout four times as long, if the timeout struck before the shortest
    rank ran out (a rank descheduled for longer than the timeout on a loaded machine): the drill
    is about the uneven shards. Each report carries the timeout its run had (``timeout_s``)."""
    for timeout in (timeout_s, 4 * timeout_s):
        reports = processes.spawn(drills.uneven, WORLD, prep["urls"], prep["shards"], LOCAL_BATCH, timeout,
                                  device="cpu", collective_timeout_s=max(120.0, timeout))
        for r in reports:
            r["timeout_s"] = timeout
        if drills.hang_at_the_end(reports):
            break
    return reports


def join_and_pad(prep: dict) -> list[dict]:
    return processes.spawn(drills.join_and_pad, WORLD, prep["urls"], prep["shards"], LOCAL_BATCH, device="cpu")


def join_parity(both: list[dict]) -> dict:
    """Each run's weights against one process trained on the same global batches: as the run
    should weigh them, and as it would if it weighed them the other way (drills.CHECKS)."""
    return both[0]["one_process"]


def resume(prep: dict) -> dict:
    """STOP_AFTER steps on WORLD ranks with a snapshot, then the rest of the epoch on RESUME_WORLD."""
    ckpt = str(Path(prep["root"]) / "resume" / "snapshot.pt")
    if os.path.exists(ckpt):
        os.remove(ckpt)
    first = processes.spawn(drills.resume, WORLD, prep["urls"], ckpt, GLOBAL_BATCH, STOP_AFTER, device="cpu")
    second = processes.spawn(drills.resume, RESUME_WORLD, prep["urls"], ckpt, GLOBAL_BATCH, None, device="cpu")
    ids = [i for r in first + second for step in r["steps"] for i in step]
    return {"first": first, "second": second, **drills.count(ids, len(prep["samples"])),
            "steps_equal": all(len({len(r["steps"]) for r in part}) == 1 for part in (first, second))}


def loaders(n: int, before: int = WORLD, after: int = RESUME_WORLD) -> list[dict]:
    return samplers.compare(n, before, after, STOP_AFTER, GLOBAL_BATCH // before)


def shuffles(prep: dict, seeds: int = 2) -> list[dict]:
    """Each order trained from the same weights, one seed per process (run side by side)."""
    return processes.spawn(_shuffle_rank, seeds, prep["urls"], prep["samples"], prep["held_out"],
                           prep["shards"], device="cpu")


def _shuffle_rank(urls, samples, held_out, shards):
    import torch.distributed as dist
    return shuffling.compare(urls, samples, held_out, shards, batch=24, seed=dist.get_rank())


def summary_line(r: dict) -> str:
    rows = {row["layout"]: row for row in r["layouts"]}
    sampler = next(row for row in r["loaders"] if row["loader"].startswith("DistributedSampler")
                   and row["rule"] == "per-rank batch kept")
    padded = [x["padded"] for x in r["join_and_pad"]]   # equal steps, and the epoch's barrier passed
    padded_equal = (all(p is not None and not p["hang"] for p in padded)
                    and len({p["steps"] for p in padded}) == 1)
    big = next(row for row in r["sizes"] if row["sample_bytes"] == 100_000)
    return (f"summary: opens_ratio={rows['loose']['opens'] / rows['shards']['opens']:.0f} "
            f"modelled_lustre_speedup={rows['loose']['wait_s'] / rows['shards']['wait_s']:.1f} "
            f"modelled_lustre_speedup_100kB={big['loose_s'] / big['shards_s']:.1f} "
            f"cpu_here_plus_modelled_lustre_speedup={rows['loose']['lustre_s'] / rows['shards']['lustre_s']:.1f} "
            f"uneven_steps_equal={int(padded_equal and r['resume']['steps_equal'])} "
            f"uneven_hang_caught={int(any(x['hang'] for x in r['uneven']))} "
            f"resume_repeated={r['resume']['repeated']} resume_missing={r['resume']['missing']} "
            f"sampler_resume_repeated={sampler['repeated']} sampler_resume_missing={sampler['missing']}")


def print_layouts(rows: list[dict]) -> None:
    print(f"{'layout':8s}{'files':>7s}{'opens':>7s}{'stats':>7s}{'lists':>7s}{'requests':>10s}"
          f"{'kB read':>9s}{'CPU s':>8s}{'Lustre wait s':>15s}{'on Lustre s':>13s}")
    for row in rows:
        print(f"{row['layout']:8s}{row['files']:7d}{row['opens']:7d}{row['stats']:7d}{row['listings']:7d}"
              f"{row['requests']:10d}{row['bytes'] / 1e3:9.0f}{row['cpu_s']:8.3f}{row['wait_s']:15.3f}"
              f"{row['lustre_s']:13.3f}")


def print_splits(rows: list[dict]) -> None:
    print(f"{'split':31s}{'samples per rank':>22s}{'steps per rank':>18s}{'dropped':>9s}{'pad slots':>10s}"
          f"{'repeated':>10s}")
    for row in rows:
        print(f"{row['split']:31s}{str(row['samples']):>22s}{str(row['steps']):>18s}{row['dropped']:9d}"
              f"{row['pads']:10d}{row['repeated']:10d}")


def print_waits_by_sample_size(rows: list[dict]) -> None:
    print(f"{'sample bytes':>12s}{'shard bytes per sample':>24s}{'loose files wait s':>20s}{'shards wait s':>15s}"
          f"{'ratio':>7s}")
    for row in rows:
        print(f"{row['sample_bytes']:12d}{row['shard_bytes']:24.0f}{row['loose_s']:20.3f}{row['shards_s']:15.3f}"
              f"{row['loose_s'] / row['shards_s']:7.1f}")


def print_staging_costs(rows: list[dict]) -> None:
    nodes = rows[0]["nodes"]
    print(f"{'':8s}{'copy (each node)':>19s}{'an epoch, 1 node':>21s}{f'node 0 of {nodes}':>21s}"
          f"{'pays after (epochs)':>35s}")
    print(f"{'layout':8s}{'requests':>12s}{'s':>7s}{'requests':>10s}{'shared s':>11s}{'requests':>10s}"
          f"{'shared s':>11s}{'1 node':>8s}{f'{nodes} nodes':>10s}{f'{nodes}, segmented':>17s}")
    for row in rows:
        print(f"{row['layout']:8s}{row['copy_requests']:12d}{row['copy_s']:7.3f}{row['epoch_requests']:10d}"
              f"{row['shared_s']:11.4f}{row['node_requests']:10d}{row['node_shared_s']:11.4f}"
              f"{row['break_even']:8.2f}{row['node_break_even']:10.2f}{row['part_break_even']:17.2f}")


def main(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=positive_int, default=1210)
    p.add_argument("--per-shard", type=positive_int, default=128)
    p.add_argument("--timeout", type=positive_float, default=3.0, help="the uneven drill's collective timeout (s)")
    args = p.parse_args(argv)
    if args.samples < GLOBAL_BATCH * (STOP_AFTER + 1):
        raise LaunchError(f"error: --samples {args.samples} is too few to stop after {STOP_AFTER} global "
                          f"batches of {GLOBAL_BATCH} and resume: give at least {GLOBAL_BATCH * (STOP_AFTER + 1)}")
    with tempfile.TemporaryDirectory(prefix="data-at-scale-") as root:
        prep = prepare(root, args.samples, args.per_shard)
        r = {"layouts": layouts(prep), "staging_costs": staging_costs(prep)}
        r["sizes"] = waits_by_sample_size(prep, r["layouts"])
        print_layouts(r["layouts"])
        print_waits_by_sample_size(r["sizes"])
        print_staging_costs(r["staging_costs"])
        print_splits(splits(args.samples, prep["shards"]))
        r["uneven"] = hang_drill(prep, args.timeout)
        print("\n".join(drills.diagnose(r["uneven"], args.timeout)))
        r["join_and_pad"] = join_and_pad(prep)
        print(f"weights against one process on the same global batches: {join_parity(r['join_and_pad'])}")
        r["resume"] = resume(prep)
        r["loaders"] = loaders(args.samples)
        r["shuffles"] = shuffles(prep)
        for seed, result in enumerate(r["shuffles"]):
            print(f"seed {seed}: " + ", ".join(f"{k} {v['pairs']:.3f} of pairs in one shard, held-out loss "
                                               f"{v['curve'][-1][1]:.3f}" for k, v in result.items()))
    print(summary_line(r), flush=True)
    return 0


if __name__ == "__main__":
    run_main(main)
