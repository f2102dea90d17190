"""Start several processes the way users do, from notebooks and tests.

* ``torchrun(module, *args, nproc=N)``: ``python -m torch.distributed.run --standalone`` on a
  module of source_code; the output comes back as text and a failure raises (a notebook cell
  running ``!torchrun`` would pass even when torchrun fails).
* ``spawn(fn, world_size, *args, device="auto")``: torch.multiprocessing with a process group
  on a free port; ``fn(*args)`` runs on every rank inside the group, and the list of its
  return values (one per rank) comes back. ``fn`` must be importable (defined in
  source_code/, not in a cell).

Both take the device explicitly: ``device="auto"`` follows the device policy
(source_code/device_policy.py: one GPU per process, else the CPU), ``device="cpu"`` keeps a
demo about an algorithm on CPU + gloo on every machine; ``None`` (the default) leaves the
choice to the environment (WORKSHOP_DEVICE, else "auto").

    python -m source_code.processes      # a 3-rank smoke test of both
"""
from __future__ import annotations

import os
import queue as queue_module
import signal
import subprocess
import sys
import threading
import traceback

import torch.multiprocessing as mp


class ProcessesFailed(RuntimeError):
    pass


DEVICES = (None, "auto", "cpu")


def _device_env(device: str | None) -> dict:
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
    return {"WORKSHOP_DEVICE": device} if device else {}


def in_notebook() -> bool:
    """True inside a Jupyter kernel: there process output is streamed into the cell as it comes."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def torchrun(module: str, *args, nproc: int = 2, env: dict | None = None, timeout: float = 600,
             check: bool = True, extra: list[str] | None = None,
             device: str | None = None, stream: bool | None = None) -> subprocess.CompletedProcess:
    """Run ``torchrun --standalone --nproc-per-node=nproc -m module args``; return the result.

    stdout and stderr are merged into ``result.stdout``; with ``check`` a non-zero exit raises
    ProcessesFailed showing the last lines, so a notebook cell fails as it should. ``stream``
    (default: inside a notebook) prints the program's lines as they come, torchrun's banner
    left out, so a long cell shows it is working. After ``timeout`` seconds the launcher and
    every process it started are killed.
    """
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", *(extra or []), "-m", module, *map(str, args)]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                **_device_env(device), **(env or {})}
    stream = in_notebook() if stream is None else stream
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=full_env, start_new_session=True)
    expired = threading.Event()

    def expire():
        expired.set()
        _stop_launcher(proc)
    timer = threading.Timer(timeout, expire)
    timer.start()
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if stream and rank_lines(line):
                print(line, end="", flush=True)
        proc.wait()
    finally:  # an interrupted cell (KeyboardInterrupt) takes its processes with it
        timer.cancel()
        _stop_launcher(proc)
    if expired.is_set():
        raise subprocess.TimeoutExpired(cmd, timeout, output="".join(lines))
    res = subprocess.CompletedProcess(cmd, proc.returncode, "".join(lines))
    if check and res.returncode != 0:
        tail = "\n".join(res.stdout.splitlines()[-25:])
        raise ProcessesFailed(f"exit status {res.returncode}: {' '.join(cmd[2:])}\n{tail}")
    return res


def _stop_launcher(proc: subprocess.Popen, grace_s: float = 10) -> None:
    """SIGTERM to torchrun, which stops its workers (each in a session of its own, out of reach
    of a signal to torchrun's group); SIGKILL to what is left after ``grace_s``."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def rank_lines(text: str) -> str:
    """The program's own lines of a torchrun output, without torchrun's banner warnings."""
    return "\n".join(ln for ln in text.splitlines()
                     if "torch/distributed/run.py" not in ln and "OMP_NUM_THREADS" not in ln)


class _ToParent:
    """A rank's stdout/stderr in a notebook: each write goes to the parent, which prints it
    (a spawned child's own output would land in the terminal that started Jupyter)."""

    def __init__(self, queue, rank: int):
        self.queue, self.rank = queue, rank

    def write(self, text: str) -> int:
        if text:
            self.queue.put((self.rank, None, text))
        return len(text)

    def flush(self) -> None:
        pass


def _worker(rank, world_size, port, device, fn, args, queue, collective_timeout_s=None, stream=False,
            env=None):
    from source_code.distributed import cleanup, setup
    if env is not None:  # the caller's environment now, not the fork server's from its start
        os.environ.clear()
        os.environ.update(env)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), **_device_env(device))
    if stream:
        sys.stdout = sys.stderr = _ToParent(queue, rank)
    failed = False
    try:
        import torch
        torch.set_num_threads(1)
        setup(**({} if collective_timeout_s is None else {"timeout_s": collective_timeout_s}))
        queue.put((rank, True, fn(*args)))
    except BaseException:  # report every failure to the parent, then exit non-zero
        failed = True
        queue.put((rank, False, traceback.format_exc()))
        raise SystemExit(1)
    finally:
        cleanup(barrier=not failed)  # a failed rank must not wait for the others in a barrier


def spawn(fn, world_size: int, *args, timeout: float = 300, device: str | None = None,
          collective_timeout_s: float | None = None, stream: bool | None = None) -> list:
    """Run ``fn(*args)`` on ``world_size`` fresh processes in one process group; return per-rank results.

    ``collective_timeout_s`` goes to ``init_process_group(timeout=...)``: a collective that some
    rank never joins fails after that many seconds instead of the default minutes (the check
    functions of the hang exercises use a few seconds). None keeps the default. ``stream``
    (default: inside a notebook) prints what the ranks print, as it comes.
    """
    from source_code.distributed import free_port
    # as torchrun does: one OpenMP thread per process, inherited by the children (with the
    # default, N processes x all cores of threads spin against each other on a laptop)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    ctx = _context()
    _device_env(device)
    queue = ctx.Queue()
    port = free_port()
    stream = in_notebook() if stream is None else stream
    procs = [ctx.Process(target=_worker, args=(r, world_size, port, device, fn, args, queue,
                                                   collective_timeout_s, stream, dict(os.environ)))
             for r in range(world_size)]
    for p in procs:
        p.start()
    results, errors = {}, []
    while len(results) < world_size and not errors:
        try:
            rank, ok, value = queue.get(timeout=1.0)
        except queue_module.Empty:  # a child that dies before reporting must not hang us
            dead = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
            if dead:
                _stop(procs)
                raise ProcessesFailed(f"processes died before reporting (rank, exit code): {dead}")
            continue
        if ok is None:  # a line the rank printed (stream)
            print(value, end="", flush=True)
        elif ok:
            results[rank] = value
        else:
            errors.append(f"rank {rank}:\n{value}")
    _stop(procs, timeout if not errors else 5)
    if errors:
        raise ProcessesFailed("\n".join(errors))
    bad = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode != 0]
    if bad:
        raise ProcessesFailed(f"processes ended badly (rank, exit code): {bad}")
    return [results[r] for r in range(world_size)]


# torch._dynamo: every torch.optim optimizer imports it when built (seconds of CPU per rank)
_PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "source_code.distributed"]


def _context():
    """Where the platform has it, a fork server that has imported torch once: each rank is
    forked from it in a fraction of a second instead of importing torch anew (about 2 s of CPU
    a process), which is most of what a short demo costs. Each child is still a fresh process
    as with "spawn" (nothing of the caller is inherited: ``fn`` must be importable), and gets
    the caller's environment as it is at the call. Elsewhere (Windows): "spawn"."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    return ctx


def _stop(procs, timeout: float = 5) -> None:
    """Join the children; kill those still running after ``timeout`` seconds."""
    for p in procs:
        p.join(timeout=timeout)
        if p.is_alive():
            p.kill()
            p.join()


def _whoami():
    import torch.distributed as dist
    return f"rank {dist.get_rank()} of {dist.get_world_size()} (pid {os.getpid()})"


if __name__ == "__main__":
    for line in spawn(_whoami, 3):
        print(line)
