"""Staging: copy the shards once per node, at the job's start, to the node's own storage, and
read them from there.

    python -m source_code.data_at_scale.staging --from SHARDS --to '/tmp/$USER-stage-{node}-$SLURM_JOB_ID'
    python -m source_code.data_at_scale.staging --to '/tmp/$USER-stage-{node}-$SLURM_JOB_ID' --remove

Run it as one task per node (``srun --ntasks-per-node=1``): ``{node}`` in ``--to`` becomes
this node's name (SLURMD_NODENAME, else the host name), and ``$VAR`` or ``${VAR}`` the node's
own value of that variable (``'$TMPDIR/stage-{node}'``, single-quoted, is expanded on each node;
a variable that is not set there stops the job in one line). Before it copies, the directory is
checked: one on a shared network file system (Lustre, GPFS, NFS, ...) or one too small for the
shards stops it in one line that names the fix. On a real cluster the node-local
directory is the node's own anyway (Roihu: ``$TMPDIR``, 150 GiB per user in a GPU job; LUMI:
``/tmp``, which lives in the node's memory; Puhti and Mahti, retired in 2026, had ``$LOCAL_SCRATCH`` asked for with
``--gres=nvme:<GB>``); on the workshop's
test cluster both nodes run on one machine and share ``/tmp``, so the node's name in the
directory keeps each node's copy its own, as on a real cluster. Each file is written under a
temporary name and renamed when complete, and the directory gets its ``.staged`` list last: a
node whose copy was interrupted has no ``.staged`` and copies again; one that has it copies
nothing (a requeued job on the same node).

When it pays, two patterns (notebook 20's model, report.staging_costs, node 0 counted):
* every node copies every file (what this command does): a whole epoch's requests and bytes on
  each node, all nodes at once when a job starts, while on N nodes each node reads only its
  share, 1/N of an epoch, per epoch: the copy pays after about N epochs on N nodes (about one on
  one node), when all the data fit one node's space (``fits``);
* segmented (LUMI's AI guide: "each node has exclusive access to the data it needs"): each node
  copies only the part it reads (``stage(..., names=...)``), so the copy pays after about one
  epoch on any number of nodes and the data need fit only N nodes' space together
  (``fits(gb, nodes=N)``). The price: the parts are fixed, so the epoch is shuffled within each
  node's part only, a job that comes back on another number of nodes stages again, and a global
  cursor over the whole epoch (notebook 20, section 4) needs every sample on every node.
Neither pays for a job that reads its data once (a large corpus seen once).
"""
from __future__ import annotations

import os
import re
import shutil
import socket
import time
from pathlib import Path

from source_code.cli import Parser
from source_code.errors import LaunchError, run_main

MARK = ".staged"

# Node-local space per node of the sites' GPU partitions, in GB (10^9 bytes): (site, GB, what it
# is, source)
NODE_LOCAL = [
    ("LUMI standard-g", 460, "no local disk: /tmp is in the node's memory (about 460 GB of it usable, "
     "shared with the job's own memory)",
     "docs.lumi-supercomputer.eu/hardware/lumig ('no local storage'); LUMI-AI-Guide, "
     "04-data-storage ('all ca. 460GB of RAM is available for RAMfs' on standard-g)"),
    ("LUMI small-g", 64, "the same /tmp in memory: 64 GB unless the job takes whole nodes "
     "(--mem 0 --exclusive)", "LUMI-AI-Guide, 04-data-storage"),
    ("Roihu gpu", round(150 * 2**30 / 1e9), "$TMPDIR on the node's NVMe disk: 150 GiB per user in a GPU "
     "job (the disk is 0.96 TB); more from CSC's disaggregated NVMe (--bb, whole nodes only)",
     "docs.csc.fi/computing/roihu-disk (Temporary local disk areas: compute nodes; Disaggregated storage)"),
]


def node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


UNSET = re.compile(r"\$(\w+|\{\w+\})")
# how a site's node-local directory is named, for the errors below
WHERE = "Roihu: '$TMPDIR/stage-{node}'; LUMI: /tmp/$USER-stage-{node}"


def node_dir(template: str) -> str:
    """``template`` with ``{node}`` replaced by this node's name and ``$VAR``/``${VAR}`` by this
    node's value of the variable (and ``~`` by the home directory)."""
    if re.search(r"[{}]", re.sub(r"\$\{\w+\}|\{node\}", "", template)):
        raise LaunchError(f"error: the directory {template!r} may hold {{node}} and no other "
                          "{...} field: write the node's place as {node}")
    path = os.path.expanduser(os.path.expandvars(template.replace("{node}", node_name())))
    unset = UNSET.search(path)
    if unset:
        raise LaunchError(f"error: the directory {template!r} names ${unset.group(1).strip('{}')}, which is not "
                          f"set on {node_name()}: set it, or give the node's own storage ({WHERE})")
    return path


# file systems that every node shares: a copy there is no staging
SHARED_FS = {"lustre", "gpfs", "nfs", "nfs4", "beegfs", "cifs", "smb3", "ceph", "fuse.sshfs"}


def file_system(path, mounts: str | None = None) -> tuple[str, str]:
    """(mount point, file system type) of ``path``, or of its nearest existing parent, from the
    kernel's mount table (``mounts``: its text, for a test)."""
    if mounts is None:
        try:
            mounts = Path("/proc/self/mounts").read_text()
        except OSError:
            return "", ""                                  # no mount table (macOS): nothing to check
    path = os.path.abspath(path)
    best = ("", "")
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) >= len(best[0]):
            best = (point, fields[2])
    return best


def check_target(directory, need_bytes: int = 0, mounts: str | None = None) -> None:
    """Stop in one line before any copy when ``directory`` is not the node's own storage (a shared
    network file system), cannot be written, or has less room than ``need_bytes``."""
    directory = Path(directory)
    point, fs = file_system(directory, mounts)
    if fs in SHARED_FS:
        raise LaunchError(f"error: {directory} is on the shared {fs} file system ({point}), not on {node_name()}'s "
                          f"own storage: staging there copies the data onto the shared file system again; "
                          f"set STAGE_DIR (--to) to node-local storage ({WHERE})")
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not os.access(existing, os.W_OK | os.X_OK):
        raise LaunchError(f"error: cannot write {directory} on {node_name()} ({existing} is not writable); "
                          f"set STAGE_DIR (--to) to node-local storage you may write ({WHERE})")
    free = shutil.disk_usage(existing).free
    if need_bytes > free:
        raise LaunchError(f"error: the shards ({need_bytes / 1e9:.3g} GB) do not fit in {directory} on {node_name()} "
                          f"({free / 1e9:.3g} GB free): stage each node's part only (segmented), or use a node "
                          "with more local space")


def staged(directory) -> list[str] | None:
    """The files of a complete staged copy, or None when there is none (or only part of one)."""
    mark = Path(directory) / MARK
    return mark.read_text().split() if mark.is_file() else None


def stage(source, directory, names: list[str] | None = None) -> dict:
    """Copy every file of ``source`` into ``directory`` unless a complete copy is there; or only
    the files ``names`` (this node's part, segmented staging: no listing then)."""
    source, directory = Path(source), Path(directory)
    if staged(directory) is not None:
        return {"files": 0, "bytes": 0, "seconds": 0.0, "copied": False, "dir": str(directory)}
    if names is None:
        with os.scandir(source) as entries:    # one listing; the entries' types come with it, no stat
            names = sorted(e.name for e in entries if e.is_file() and not e.name.startswith("."))
    if not names:
        raise LaunchError(f"error: nothing to stage in {source}; write the shards first "
                          "(python -m source_code.data_at_scale.formats --out DIR --only shards)")
    directory.mkdir(parents=True, exist_ok=True)
    start, size = time.perf_counter(), 0
    for name in names:                     # one open per file on the shared side, nothing else
        partial = directory / f".{name}.partial"
        with open(source / name, "rb") as src, open(partial, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
            size += dst.tell()
        os.replace(partial, directory / name)
    (directory / MARK).write_text("\n".join(names) + "\n")
    return {"files": len(names), "bytes": size, "seconds": time.perf_counter() - start, "copied": True,
            "dir": str(directory)}


# The node's own copy in memory (LUMI's /tmp), LUMI-AI-Guide 04-data-storage: reads of 7,800 MB/s
# and writes of 2,900 MB/s on standard-g
LOCAL_READ_BYTES_S, LOCAL_WRITE_BYTES_S = 7.8e9, 2.9e9


def break_even(copy_s: float, shared_epoch_s: float, local_epoch_s: float) -> float:
    """Epochs after which copy + epochs x local costs less than epochs x shared (inf: never)."""
    saved = shared_epoch_s - local_epoch_s
    return copy_s / saved if saved > 0 else float("inf")


def fits(dataset_gb: float, nodes: int = 1) -> list[tuple[str, int, bool, str]]:
    """(site, its node-local GB, whether the data fit, what that space is) for each site: all of
    the data on every node (``nodes=1``), or a 1/``nodes`` part on each of ``nodes`` (segmented)."""
    part = dataset_gb / nodes
    return [(site, gb, part <= gb, what) for site, gb, what, _ in NODE_LOCAL]


def main(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--from", dest="source", help="the shards' directory on the shared file system")
    p.add_argument("--to", dest="target", required=True,
                   help="this node's directory; {node} becomes the node's name")
    p.add_argument("--remove", action="store_true", help="remove this node's copy (the job's last step)")
    args = p.parse_args(argv)
    if args.remove:
        shutil.rmtree(node_dir(args.target), ignore_errors=True)   # quiet: the job's last line stays the training's
        return 0
    if not args.source or not Path(args.source).is_dir():
        raise LaunchError(f"error: --from {args.source} is not a directory; write the shards first "
                          "(python -m source_code.data_at_scale.formats --out DIR --only shards)")
    target = node_dir(args.target)
    if staged(target) is None:                  # before any copy: the node's own storage, with room
        with os.scandir(args.source) as entries:
            check_target(target, sum(e.stat().st_size for e in entries if e.is_file() and not e.name.startswith(".")))
    r = stage(args.source, target)
    node = node_name()
    if r["copied"]:
        print(f"staged on {node}: {r['files']} files, {r['bytes'] / 1e6:.2f} MB in {r['seconds']:.2f} s "
              f"to {target}", flush=True)
    else:
        print(f"staged on {node}: a complete copy is already in {target}", flush=True)
    print(f"summary: node={node} dir={target} files={len(staged(target))} copied={int(r['copied'])}", flush=True)
    return 0


if __name__ == "__main__":
    run_main(main)
