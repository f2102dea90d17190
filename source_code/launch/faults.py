"""Fault drills: a rank that dies mid-epoch, a process killed while it writes a snapshot.

    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --standalone --nproc-per-node=2 --max-restarts=1 \\
        -m source_code.training.ddp_fault_tolerant \\
        --epochs 3 --max-steps 6 --checkpoint /tmp/snap.pt --resume --crash-at-step 9
    python -m source_code.launch.faults kill-during-write /tmp/snap.pt

* ``arm_crash``: once per run, rank 1 sends itself SIGKILL right after the optimizer's N-th
  global step, the way a node failure or an out-of-memory kill ends a process: no exception, no
  cleanup. torchrun then stops the other ranks and (with --max-restarts) starts them all again.
  "Once per run": with a ``marker`` file (``crash_marker``, beside the checkpoint, named after
  torchrun's run id) on whichever attempt first reaches step N, so an attempt that failed
  earlier for another reason does not cancel the drill; without one, on the first attempt
  (TORCHELASTIC_RESTART_COUNT 0). Never after a Slurm requeue (SLURM_RESTART_COUNT > 0).
* ``kill_during_write``: a child process rewrites a large snapshot with ``atomic_save`` over
  and over; after its first complete save the kernel kills it in the middle of the next write,
  the moment the file reaches half a snapshot (``die_in_write_past``). The snapshot at the real
  path must still load and be a complete earlier version.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import torch

from source_code.cli import Parser, positive_int
from source_code.errors import run_main


def first_attempt(env=None) -> bool:
    env = os.environ if env is None else env
    return (env.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
            and env.get("SLURM_RESTART_COUNT", "0") == "0")


def crash_marker(checkpoint, env=None) -> str | None:
    """The file that records this torchrun run's crash, beside ``checkpoint`` (None without a
    checkpoint or a run id of torchrun's: then the crash keys on the first attempt instead)."""
    env = os.environ if env is None else env
    run_id = env.get("TORCHELASTIC_RUN_ID", "none")
    if not checkpoint or run_id == "none":
        return None
    return f"{checkpoint}.crashed-{run_id}"


def arm_crash(optimizer, at_step: int, rank: int, world_size: int, steps_done: int = 0,
              marker: str | None = None) -> bool:
    """Make rank 1 (rank 0 when alone) SIGKILL itself after global step ``at_step``, once.

    ``steps_done``: optimizer steps already taken before this attempt (a resumed run).
    ``marker``: a file written just before the kill; while it exists the crash is not armed
    (without one: armed on the first attempt only). Returns whether the crash is armed here.
    """
    if at_step <= 0 or rank != min(1, world_size - 1):
        return False
    if os.environ.get("SLURM_RESTART_COUNT", "0") != "0":
        return False
    if (os.path.exists(marker) if marker else not first_attempt()):
        return False
    count = [steps_done]

    def after_step(opt, args, kwargs):
        count[0] += 1
        if count[0] == at_step:
            if marker:
                Path(marker).write_text(f"rank {rank} killed itself after global step {at_step}\n")
            print(f"rank {rank}: simulated failure after global step {at_step} (SIGKILL)",
                  flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    optimizer.register_step_post_hook(after_step)
    return True


def steps_per_epoch(loader, max_steps: int = 0) -> int:
    return min(len(loader), max_steps) if max_steps else len(loader)


# --------------------------------------------------------------------------- interrupted writes
def die_in_write_past(nbytes: int) -> None:
    """From now on the kernel kills this process the moment a write would take any file past
    ``nbytes`` bytes: the file-size limit (RLIMIT_FSIZE) and SIGXFSZ's default action, which
    Python ignores unless told. Like SIGKILL no handler or ``except`` runs, but at a known point
    in the middle of a write, whatever the machine's speed or load. No core file is left."""
    import resource
    resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


def _rewrite_forever(path: str, megabytes: int) -> None:
    from source_code.checkpoint import atomic_save
    n = megabytes * 2**20 // 4
    version = 0
    while True:
        version += 1
        atomic_save({"version": version, "weights": torch.full((n,), float(version))}, path)
        print(version, flush=True)
        if version == 1:  # one complete snapshot exists: the next write dies half way
            die_in_write_past(os.stat(path).st_size // 2)


def kill_during_write(path, megabytes: int = 64, timeout: float = 60) -> dict:
    """Kill a writer in the middle of a write (half a snapshot written); report what is left at
    ``path``. ``timeout`` only bounds a writer that never dies."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for old in path.parent.glob(path.name + ".*.tmp"):
        old.unlink()
    path.unlink(missing_ok=True)
    child = subprocess.Popen([sys.executable, "-m", "source_code.launch.faults", "rewrite",
                              str(path), "--megabytes", str(megabytes)],
                             stdout=subprocess.PIPE, text=True)
    written = 0
    try:
        written = int(child.stdout.readline() or 0)  # one complete snapshot exists
        child.wait(timeout)                          # the second write kills the writer
    except subprocess.TimeoutExpired:
        raise TimeoutError(f"the writer was still alive after {timeout:.0f} s") from None
    finally:
        child.kill()
        child.wait()
    snap = torch.load(path, weights_only=True)
    leftovers = list(path.parent.glob(path.name + ".*.tmp"))
    result = {"killed_mid_write": child.returncode == -signal.SIGXFSZ and bool(leftovers),
              "partial_bytes": leftovers[0].stat().st_size if leftovers else 0,
              "full_bytes": path.stat().st_size, "version": snap["version"],
              "complete": bool((snap["weights"] == snap["version"]).all())
              and snap["weights"].numel() == megabytes * 2**20 // 4,
              "first_version_seen": written}
    for f in leftovers:
        f.unlink()
    return result


def main(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    k = sub.add_parser("kill-during-write", help="kill a writer mid-write, then load what is left")
    k.add_argument("path")
    k.add_argument("--megabytes", type=positive_int, default=64)
    r = sub.add_parser("rewrite", help="(the child of kill-during-write)")
    r.add_argument("path")
    r.add_argument("--megabytes", type=positive_int, default=64)
    a = p.parse_args(argv)
    if a.cmd == "rewrite":
        _rewrite_forever(a.path, a.megabytes)
    else:
        res = kill_during_write(a.path, a.megabytes)
        print(" ".join(f"{k}={v}" for k, v in res.items()))
    return 0


if __name__ == "__main__":
    run_main(main)
