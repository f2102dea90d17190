"""Start ``python -m MODULE ARGS`` as a process forked from the fork server that has torch imported.

    proc = forked.start("torch.distributed.run", ["--standalone", ...], out="agent.log", env=env)
    lines = forked.Tail(out, proc, on_line=print)       # its lines as they come

The drills of notebook 17 start processes again and again: torchrun agents (a node), torchft's
replica groups, a restarted job. Each would import torch anew (seconds of CPU a start, tens of
seconds on a loaded laptop), which is not what the drills measure. So each program runs as it
would from its command line (``runpy``: its ``if __name__ == "__main__"`` block, ``sys.argv``),
in a child of source_code/processes.py's fork server, which imported torch once:
* a new session (``os.killpg(proc.pid, ...)`` ends it with every process it started);
* stdout and stderr, at the file-descriptor level (C++ and Rust logs, forked workers too), to
  the file ``out``, line-buffered; ``Tail`` reads it back as it grows;
* the caller's environment as it is at the call (not the fork server's from its start);
* the exit status as a command's: ``proc.exitcode``, -9 after a SIGKILL.
A torchrun agent started so forks its workers too (``--start-method=fork --run-path SCRIPT``,
torchrun's own flags): the same agent, rendezvous and restarts, without an import per worker.
"""
from __future__ import annotations

import logging
import os
import runpy
import select
import signal
import sys
import threading
import time

from source_code import processes


def _run(module: str, argv: list, out: str, env: dict) -> None:
    os.setsid()
    os.environ.clear()
    os.environ.update(env)
    if "LOGLEVEL" in env:     # torch.distributed's loggers made before the environment came (the
        for name, logger in logging.root.manager.loggerDict.items():   # caller's main module) take it
            if name.startswith("torch.distributed") and isinstance(logger, logging.Logger):
                logger.setLevel(env["LOGLEVEL"])
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True)
    sys.argv = [module, *map(str, argv)]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def start(module: str, argv: list, out: str, env: dict | None = None):
    """Start ``python -m module argv`` forked from the preloaded server; returns the process."""
    proc = processes._context().Process(target=_run, args=(module, list(argv), out, dict(env or os.environ)),
                                        name=module)
    proc.start()
    return proc


def kill(proc) -> None:
    """SIGKILL to the process and everything in its session (its workers, forked or not)."""
    if proc.exitcode is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.join()


def ended(proc) -> bool:
    """Has ``proc`` ended? Asked without reading its exit status (``proc.exitcode`` reads it
    from the fork server's pipe, which only one thread may do)."""
    try:
        return bool(select.select([proc.sentinel], [], [], 0)[0])
    except (ValueError, OSError):
        return True


class Tail:
    """Read the lines of ``path`` as ``proc`` writes them, in a thread, until it has ended:
    ``lines`` keeps them, ``on_line(line)`` sees each one."""

    def __init__(self, path: str, proc, on_line=None):
        self.path, self.proc, self.on_line, self.lines = path, proc, on_line, []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while not os.path.exists(self.path) and not ended(self.proc):
            time.sleep(0.02)
        with open(self.path, errors="replace") as f:
            part = ""
            while True:
                done = ended(self.proc)                   # read once more after the end
                chunk = f.readline()
                if chunk:
                    part += chunk
                    if part.endswith("\n"):
                        self.lines.append(part)
                        if self.on_line:
                            self.on_line(part)
                        part = ""
                    continue
                if done:
                    break
                time.sleep(0.02)
            if part:
                self.lines.append(part + "\n")

    def join(self, timeout: float = 5) -> list:
        self.thread.join(timeout)
        return self.lines
