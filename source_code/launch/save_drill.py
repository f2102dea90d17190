"""Kill ANY save function in the middle of a write, and look at what is left (notebook 07).

    python -m source_code.launch.save_drill            # plain torch.save vs atomic_save, a line each

``kill_mid_write(save, path)`` forks a child that calls ``save(obj, path)`` over and over with
a new version each time. After two complete saves the kernel kills the child the moment any
file it writes reaches half a snapshot (``faults.die_in_write_past``: a kill at a known point
in the middle of a write, whatever the machine's speed or load). Then it loads ``path``. With
a plain ``torch.save(obj, path)`` the half-written file IS the snapshot: it no longer loads
(the negative control). With a save that writes elsewhere and renames, ``path`` is still a
complete earlier version. The child also notes whether the second save wrote its bytes into
the file already at ``path`` (same file, new contents): a save that does is killable there too,
and what the save calls around its rename: a file renamed onto ``path`` must have had all its
bytes fsynced first and come from ``path``'s own directory.

``check_atomic_save(save)`` is the check of the notebook's exercise: it runs the drill on the
learner's function and says what went wrong, if anything.
"""
from __future__ import annotations

import io
import multiprocessing as mp
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import torch

from source_code.cli import Parser, positive_int
from source_code.errors import run_main
from source_code.launch.faults import die_in_write_past


def _snapshot(version: int, numel: int) -> dict:
    return {"version": version, "weights": torch.full((numel,), float(version))}


def _watch_calls(save, path: str, seen) -> None:
    """In the drill's child only: note what a save does around its rename. ``seen`` gets 1 in
    slot 0 when a file is renamed onto ``path`` with fewer bytes synced than it holds (os.fsync
    or os.fdatasync on it, or an os.sync, since its last rename), in 1 when that file was in
    another directory, in 2 when the rename is called from inside the workshop's own atomic_save
    (however it was reached), in 3 when ``path`` itself is removed (a kill then leaves nothing).
    The os functions are replaced in ``os`` and where ``save``'s module holds them by name."""
    import source_code.checkpoint as project
    synced, everything = {}, [False]                   # (device, inode) -> bytes on disk at its sync
    target = os.path.abspath(path)
    real = {name: getattr(os, name) for name in ("fsync", "fdatasync", "sync", "replace", "rename",
                                                 "remove", "unlink")}

    def fsync(fd, _real=real["fsync"]):
        _real(fd)
        st = os.fstat(fd if isinstance(fd, int) else fd.fileno())
        synced[st.st_dev, st.st_ino] = st.st_size

    def sync():
        real["sync"]()
        everything[0] = True

    def renaming(name):
        def renamed(src, dst, *args, **kwargs):
            frame = sys._getframe(1)
            while frame is not None:                  # called from inside the workshop's own?
                seen[2] |= frame.f_code is project.atomic_save.__code__
                frame = frame.f_back
            if os.path.abspath(os.fspath(dst)) == target and os.path.exists(src):
                st = os.stat(src)
                if synced.get((st.st_dev, st.st_ino), -1) < st.st_size and not everything[0]:
                    seen[0] = 1
                if not os.path.samefile(os.path.dirname(os.path.abspath(os.fspath(src))),
                                        os.path.dirname(target)):
                    seen[1] = 1
                everything[0] = False
            return real[name](src, dst, *args, **kwargs)
        return renamed

    def removing(name):
        def removed(p, *args, **kwargs):
            if os.path.abspath(os.fspath(p)) == target:
                seen[3] = 1
            return real[name](p, *args, **kwargs)
        return removed

    watched = {"fsync": fsync, "fdatasync": fsync, "sync": sync, "replace": renaming("replace"),
               "rename": renaming("rename"), "remove": removing("remove"), "unlink": removing("unlink")}
    names = getattr(save, "__globals__", {})
    for name, fn in watched.items():
        setattr(os, name, fn)
        for key, value in list(names.items()):         # `from os import fsync` in the learner's cell
            if value is real[name]:
                names[key] = fn


def _rewrite_forever(save, path: str, numel: int, full: int, saved, in_place, seen) -> None:
    torch.set_num_threads(1)
    _watch_calls(save, path, seen)
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

    Returns {"killed_mid_write", "loads", "complete", "version", "in_place", "unsynced",
    "elsewhere", "project", "removes_path", "error"}: ``loads`` is whether ``torch.load(path)``
    still works afterwards, ``complete`` whether it holds a whole snapshot, ``in_place`` whether a
    save wrote into the file already at ``path``; the next four what ``_watch_calls`` saw (a file
    renamed onto ``path`` before all its bytes were synced, or from another directory; the
    workshop's own atomic_save called; ``path`` removed). A save that
    writes no file of a snapshot's size is not killed (``killed_mid_write`` False) once it has
    saved 3 more versions; ``timeout`` only bounds a save that never returns.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for old in path.parent.iterdir():  # the drill owns this directory
        shutil.rmtree(old) if old.is_dir() and not old.is_symlink() else old.unlink()
    numel = megabytes * 2**20 // 4
    buf = io.BytesIO()
    torch.save(_snapshot(1, numel), buf)
    full = buf.getbuffer().nbytes  # the size of one complete snapshot
    # fork: the save function may be defined in a notebook cell (spawn could not pickle it)
    ctx = mp.get_context("fork")
    saved, in_place, seen = ctx.Value("i", 0), ctx.Value("i", 0), ctx.Array("i", 4)
    child = ctx.Process(target=_rewrite_forever, args=(save, str(path), numel, full, saved, in_place, seen),
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
              "in_place": bool(in_place.value), "unsynced": bool(seen[0]), "elsewhere": bool(seen[1]),
              "project": bool(seen[2]), "removes_path": bool(seen[3]), "error": ""}
    try:
        snap = torch.load(path, weights_only=True)
        result.update(loads=True, version=snap["version"],
                      complete=snap["weights"].numel() == numel
                      and bool((snap["weights"] == snap["version"]).all()))
    except Exception as err:  # noqa: BLE001 - any failure to load is the finding
        first = str(err).splitlines()[0].split(". ")[0]  # the first sentence says enough
        result["error"] = f"{type(err).__name__}: {first}"
    for f in path.parent.iterdir():
        shutil.rmtree(f) if f.is_dir() and not f.is_symlink() else f.unlink()
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
    if res["project"]:
        raise AssertionError("your function calls the workshop's own atomic_save: write the steps yourself")
    if res["removes_path"]:
        raise AssertionError("your save removes PATH before the new file takes its place: a kill in between "
                             "leaves no snapshot at all (hint: one step must swap the finished file in)")
    if res["elsewhere"]:
        raise AssertionError("the file your save renames onto PATH was written in another directory: a rename "
                             "is atomic only within one file system, and only PATH's own directory is sure to be "
                             "on PATH's (across two, os.replace fails, and shutil.move copies: a write a kill can "
                             "break)")
    if res["unsynced"]:
        raise AssertionError("your save renames a file onto PATH before all of its bytes are synced to the disk "
                             "(os.fsync, after the file object's own buffer is flushed): after a power cut PATH "
                             "could name a file whose last bytes never reached the disk")
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
