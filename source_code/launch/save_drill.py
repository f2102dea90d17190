"""Kill ANY save function in the middle of a write, and look at what is left (notebook 07).

    python -m source_code.launch.save_drill            # plain torch.save vs atomic_save, a line each

``kill_mid_write(save, path)`` forks a child that calls ``save(obj, path)`` over and over with
a new version each time; the parent watches the directory and SIGKILLs the child the moment
some file there is partly written (bigger than 0 bytes, smaller than a complete snapshot).
Then it loads ``path``. With a plain ``torch.save(obj, path)`` the partly written file IS the
snapshot: it no longer loads (the negative control). With a save that writes elsewhere and
renames, ``path`` is still a complete earlier version.

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


def _snapshot(version: int, numel: int) -> dict:
    return {"version": version, "weights": torch.full((numel,), float(version))}


def _rewrite_forever(save, path: str, numel: int, saved) -> None:
    torch.set_num_threads(1)
    version = 0
    while True:
        version += 1
        save(_snapshot(version, numel), path)
        saved.value = version  # the parent waits for the first complete save


def _partial_files(directory: Path, full: int) -> list[Path]:
    """Files well under a complete snapshot's size (the archive's record names depend on the
    file name, so complete files differ by a few hundred bytes: hence the 5 % margin)."""
    found = []
    for f in directory.iterdir():
        try:
            if 0 < f.stat().st_size < 0.95 * full:
                found.append(f)
        except FileNotFoundError:  # renamed away between listing and stat
            pass
    return found


def kill_mid_write(save, path, megabytes: int = 16, timeout: float = 60, only_path: bool = False) -> dict:
    """SIGKILL a process that repeatedly runs ``save(obj, path)`` while a write is in flight.

    ``only_path``: kill only when the file at ``path`` itself is partly written (a save that
    never leaves it so is not killed: ``killed_mid_write`` False after ``timeout`` seconds).
    Returns {"killed_mid_write", "loads", "complete", "version", "error"}: ``loads`` is whether
    ``torch.load(path)`` still works afterwards, ``complete`` whether it holds a whole snapshot.
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
    saved = ctx.Value("i", 0)
    child = ctx.Process(target=_rewrite_forever, args=(save, str(path), numel, saved), daemon=True)
    child.start()
    killed, t0 = False, time.time()
    try:
        # wait for one complete snapshot, then for the next write to be half done
        while time.time() - t0 < timeout and child.is_alive() and saved.value < 1:
            time.sleep(0.001)
        while time.time() - t0 < timeout and child.is_alive():
            partial = _partial_files(path.parent, full)
            if partial and (path in partial or not only_path):
                os.kill(child.pid, signal.SIGKILL)
                killed = True
                break
            time.sleep(0.0005)
    finally:
        if child.is_alive():
            os.kill(child.pid, signal.SIGKILL)
        child.join()
    result = {"killed_mid_write": killed, "loads": False, "complete": False, "version": None,
              "error": ""}
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
    if res["loads"]:  # second drill: wait for PATH itself to be partly written (a copy into place)
        at_path = kill_mid_write(save, directory / "snap.pt", timeout=3, only_path=True)
        res = at_path if at_path["killed_mid_write"] else res
    if not res["loads"]:
        raise AssertionError(f"after the kill the snapshot at the real path does not load ({res['error']}): "
                             "the half-written file must never be the one at PATH (hint: write somewhere "
                             "else first, then make PATH point at the finished file in one step)")
    if not res["complete"]:
        raise AssertionError("the snapshot at the real path loads but is not a whole version (hint: move the "
                             "file into place only after the write has finished and reached the disk)")
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
