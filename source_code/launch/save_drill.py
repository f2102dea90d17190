"""Kill ANY save function in the middle of a write, and look at what is left (notebook 07).

    python -m source_code.launch.save_drill            # plain torch.save vs atomic_save, a line each

``kill_mid_write(save, path)`` forks a child that calls ``save(obj, path)`` over and over with
a new version each time. After two complete saves the kernel kills the child the moment any
file it writes reaches half a snapshot (``faults.die_in_write_past``: a kill at a known point
in the middle of a write, whatever the machine's speed or load). Then it loads ``path``. With
a plain ``torch.save(obj, path)`` the half-written file IS the snapshot: it no longer loads
(the negative control). With a save that writes elsewhere and renames, ``path`` is still a
complete earlier version. The child also notes whether the second save wrote its bytes into
the file already at ``path`` (same file, new contents): a save that does is killable there too.

``check_atomic_save(save)`` is the check of the notebook's exercise: it runs the drill on the
learner's function and says what went wrong, if anything.
"""
from __future__ import annotations

import io
import multiprocessing as mp
import os
import signal
import time
from pathlib import Path

import torch

from source_code.cli import Parser, positive_int
from source_code.errors import run_main
from source_code.launch.faults import die_in_write_past


def _snapshot(version: int, numel: int) -> dict:
    return {"version": version, "weights": torch.full((numel,), float(version))}


def _rewrite_forever(save, path: str, numel: int, full: int, saved, in_place) -> None:
    torch.set_num_threads(1)
    save(_snapshot(1, numel), path)
    if os.path.exists(path):
        with open(path, "rb") as held:  # held open: its inode cannot be reused while we compare
            before = os.fstat(held.fileno())
            save(_snapshot(2, numel), path)
            now = os.stat(path) if os.path.exists(path) else None
            in_place.value = int(now is not None and (now.st_ino, now.st_dev) == (before.st_ino, before.st_dev))
    else:
        save(_snapshot(2, numel), path)
    saved.value = 2
    die_in_write_past(full // 2)  # the next write that reaches half a snapshot kills us
    version = 2
    while True:
        version += 1
        save(_snapshot(version, numel), path)
        saved.value = version


def kill_mid_write(save, path, megabytes: int = 16, timeout: float = 60) -> dict:
    """Kill a process that repeatedly runs ``save(obj, path)`` when a write reaches half a snapshot.

    Returns {"killed_mid_write", "loads", "complete", "version", "in_place", "error"}: ``loads``
    is whether ``torch.load(path)`` still works afterwards, ``complete`` whether it holds a whole
    snapshot, ``in_place`` whether a save wrote into the file already at ``path``. A save that
    writes no file of a snapshot's size is not killed (``killed_mid_write`` False) once it has
    saved 3 more versions; ``timeout`` only bounds a save that never returns.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for old in path.parent.iterdir():  # the drill owns this directory
        old.unlink()
    numel = megabytes * 2**20 // 4
    buf = io.BytesIO()
    torch.save(_snapshot(1, numel), buf)
    full = buf.getbuffer().nbytes  # the size of one complete snapshot
    # fork: the save function may be defined in a notebook cell (spawn could not pickle it)
    ctx = mp.get_context("fork")
    saved, in_place = ctx.Value("i", 0), ctx.Value("i", 0)
    child = ctx.Process(target=_rewrite_forever, args=(save, str(path), numel, full, saved, in_place),
                        daemon=True)
    child.start()
    deadline = time.monotonic() + timeout
    try:
        while child.is_alive() and saved.value < 5 and time.monotonic() < deadline:
            child.join(0.05)
    finally:
        if child.is_alive():
            os.kill(child.pid, signal.SIGKILL)
        child.join()
    killed = child.exitcode == -signal.SIGXFSZ
    result = {"killed_mid_write": killed, "loads": False, "complete": False, "version": None,
              "in_place": bool(in_place.value), "error": ""}
    try:
        snap = torch.load(path, weights_only=True)
        result.update(loads=True, version=snap["version"],
                      complete=snap["weights"].numel() == numel
                      and bool((snap["weights"] == snap["version"]).all()))
    except Exception as err:  # noqa: BLE001 - any failure to load is the finding
        first = str(err).splitlines()[0].split(". ")[0]  # the first sentence says enough
        result["error"] = f"{type(err).__name__}: {first}"
    for f in path.parent.iterdir():
        f.unlink()
    return result


def check_atomic_save(save, directory=None) -> str:
    """The exercise's check: ``save(obj, path)`` must survive a kill in the middle of a write."""
    import tempfile
    try:
        save({"probe": torch.zeros(1)}, os.path.join(tempfile.mkdtemp(), "probe.pt"))
    except NotImplementedError:
        raise NotImplementedError("exercise not done yet: fill in your save function, then run this cell again") from None
    directory = Path(directory or tempfile.mkdtemp(prefix="drill-"))
    res = kill_mid_write(save, directory / "snap.pt")
    if not res["killed_mid_write"]:
        raise AssertionError("the drill never saw a write in flight: does your function write the file at all?")
    if not res["loads"]:
        raise AssertionError(f"after the kill the snapshot at the real path does not load ({res['error']}): "
                             "the half-written file must never be the one at PATH (hint: write somewhere "
                             "else first, then make PATH point at the finished file in one step)")
    if not res["complete"]:
        raise AssertionError("the snapshot at the real path loads but is not a whole version (hint: move the "
                             "file into place only after the write has finished and reached the disk)")
    if res["in_place"]:  # a copy into place: the kill hit the first file, the second write is as fragile
        raise AssertionError("your save writes the new bytes into the file already at PATH: killed during that "
                             "write it is half written and does not load (hint: PATH must only ever change "
                             "by one step that swaps in a finished file)")
    return f"correct: killed mid-write, the snapshot at the real path is complete (version {res['version']})"


def main(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--directory", default="", help="scratch directory (default: a new temporary one)")
    p.add_argument("--megabytes", type=positive_int, default=16)
    a = p.parse_args(argv)
    import tempfile
    from source_code.checkpoint import atomic_save
    base = Path(a.directory or tempfile.mkdtemp(prefix="save-drill-"))
    for name, save in (("torch.save", torch.save), ("atomic_save", atomic_save)):
        res = kill_mid_write(save, base / name.replace(".", "_") / "snap.pt", a.megabytes)
        print(f"{name:12s} killed_mid_write={res['killed_mid_write']} loads={res['loads']} "
              f"complete={res['complete']} {res['error']}".rstrip())
    return 0


if __name__ == "__main__":
    run_main(main)
