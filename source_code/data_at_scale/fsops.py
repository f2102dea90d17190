"""What a reader asks of the file system, counted from its own calls, and an epoch's time on a shared file
system whose metadata latency comes from a published measurement.

    with fsops.counting(root) as ops:
        for _ in reader(...): pass
    ops.opens, ops.stats, ops.listings
    row = fsops.epoch(reader, source, root)       # counts, bytes, CPU seconds of one epoch
    fsops.on_shared(row, fsops.LUSTRE)            # its CPU time + one round trip per request

The counts come from the reader's own calls, inside libraries too: an audit hook (PEP 578,
``sys.addaudithook``) sees every ``open`` of the process (builtins.open, io.open, os.open:
the reader's own, WebDataset's, NumPy's) and every ``os.listdir``/``os.scandir``; ``os.stat``
and ``os.lstat`` (behind os.path.exists/getsize/isfile and pathlib) are wrapped while counting.
Only paths under ``root`` count. An open made in C++ without Python (pyarrow's own file
readers) is not seen: the Arrow reader of formats.py opens its file through Python.

What is counted is what Python asks for; what it does not see: the ``fstat`` that ``open()``
and buffered reads make on a descriptor already open (on Lustre its attributes come back with
the open's request to the metadata server, but the size is the storage targets' (OSTs) to tell,
a glimpse, unless the site keeps small files on the metadata server: Data-on-MDT), the ``close``
(on Lustre a request to the metadata server too), and the first read of each file, a request to
a storage target unless the file is on the metadata server. So the model below charges one
round trip per counted request and leaves those out.

On Lustre (and GPFS) each counted request goes to a metadata server over the network, while on
a local disk with a warm cache it costs microseconds. ``waiting`` is what one reader waits for
the shared file system in an epoch: one metadata round trip (``SharedFS.metadata_s``) per
request, one after the other, and the bytes of the files it opened at one reader's streaming
rate (``SharedFS.read_bytes_s``): it depends on the counts only, not on this machine.
``on_shared`` adds the reader's own CPU time, measured here (``time.process_time``), which
does depend on this machine.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import time
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SharedFS:
    name: str
    metadata_s: float      # one metadata request (open, stat, listing) seen from one client thread
    read_bytes_s: float    # one reader streaming one file
    source: str


LUSTRE = SharedFS(
    "Lustre", 0.0005, 161e6,
    "metadata: MDtest on Lustre 2.5 (QDR InfiniBand, 15K rpm disks), one client thread against an "
    "otherwise idle metadata server: a little over 2,000 file stats per second, about 0.5 ms each "
    "(Dell, 'Dell Storage for HPC with Intel Enterprise Edition for Lustre software', metadata "
    "results, figure 12; the same figure gives 504 file creates per second; opens are not measured "
    "there, and this model charges every open, stat and listing a stat's 0.5 ms). Not LUMI's "
    "hardware; a metadata server shared with every job of a machine answers slower under load (LUMI-P "
    "has one per file system, docs.lumi-supercomputer.eu/hardware/storage/lumip; Lustre can spread "
    "a file system's metadata over several servers, DNE). Bandwidth: 161 MB/s, LUMI-P's average read "
    "rate of one storage target (OST) into a compute node's memory (LUMI-AI-Guide, "
    "04-data-storage), what one reader of one file (one stripe) gets")


@dataclass
class Ops:
    root: str
    opens: int = 0
    stats: int = 0
    listings: int = 0
    paths: set = field(default_factory=set)

    @property
    def total(self) -> int:
        return self.opens + self.stats + self.listings

    def hit(self, kind: str, path) -> None:
        try:
            path = os.fsdecode(os.fspath(path))
        except TypeError:          # an open by file descriptor: no path, no metadata request
            return
        if not os.path.abspath(path).startswith(self.root):
            return
        setattr(self, kind, getattr(self, kind) + 1)
        self.paths.add(os.path.abspath(path))


_ACTIVE: list[Ops] = []
_HOOKED = False
_EVENTS = {"open": "opens", "os.listdir": "listings", "os.scandir": "listings"}


def _audit(event: str, args) -> None:
    if _ACTIVE and event in _EVENTS and args:
        _ACTIVE[-1].hit(_EVENTS[event], args[0])


@contextlib.contextmanager
def counting(root):
    """Count the file-system requests for paths under ``root`` made inside the ``with`` block."""
    global _HOOKED
    if not _HOOKED:                # an audit hook cannot be removed: one for the process, idle
        sys.addaudithook(_audit)   # while no counting is active
        _HOOKED = True
    ops = Ops(os.path.abspath(os.fspath(root)))
    stat, lstat = os.stat, os.lstat

    def counted(real):
        def call(path, *args, **kwargs):
            ops.hit("stats", path)
            return real(path, *args, **kwargs)
        return call
    os.stat, os.lstat = counted(stat), counted(lstat)
    _ACTIVE.append(ops)
    try:
        yield ops
    finally:
        _ACTIVE.remove(ops)
        os.stat, os.lstat = stat, lstat


def epoch(reader, source, root) -> dict:
    """Read one epoch with ``reader(source)``: its ids, a digest of every (id, bytes), the
    requests, the bytes of the files it opened, and its CPU and wall seconds."""
    with counting(root) as ops:
        cpu, wall = time.process_time(), time.perf_counter()
        pairs = list(reader(source))
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    digest = hashlib.sha1(b"".join(i.to_bytes(4, "little") + bytes(b) for i, b in sorted(pairs)))
    return {"ids": [i for i, _ in pairs], "digest": digest.hexdigest(), "opens": ops.opens, "stats": ops.stats, "listings": ops.listings,
            "requests": ops.total, "files": sum(os.path.isfile(p) for p in ops.paths),   # not the listed directory
            "bytes": sum(os.path.getsize(p) for p in ops.paths if os.path.isfile(p)),
            "cpu_s": cpu, "wall_s": wall}


def waiting(requests: int, nbytes: int, fs: SharedFS = LUSTRE) -> float:
    """Seconds one reader waits for ``fs``: a metadata round trip per request, then the bytes."""
    return requests * fs.metadata_s + nbytes / fs.read_bytes_s


def on_shared(row: dict, fs: SharedFS = LUSTRE) -> float:
    """Seconds of that epoch on ``fs``: its CPU time plus what it waits for ``fs``."""
    return row["cpu_s"] + waiting(row["requests"], row["bytes"], fs)
