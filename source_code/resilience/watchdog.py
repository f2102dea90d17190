"""Hangs: a watchdog thread in every training process that notices no progress and says where each rank is.

    python -m source_code.resilience.health_drill --hang-rank 1

A collective that one rank never joins blocks the others silently until the process group's
timeout (minutes; notebook 15). A watchdog does better from inside the process:
* the training loop marks where it is: ``dog.at(step, "forward")``, ``dog.at(step, "all_reduce")``;
  each mark goes to the rendezvous store (a few bytes) as well as to the thread;
* the thread wakes every ``poll_s``; once armed (``arm(timeout_s)``), when the mark has not moved
  for ``timeout_s`` it reads every rank's last mark from the store and hands the report to
  ``on_hang``: who is where, since when. ``stuck_outside(report, timeout_s)`` names the ranks that
  have not moved for the timeout outside the collective: the ones to look at (their stacks:
  py-spy dump --pid); those waiting inside it are victims.
A real job arms it from the first step with a timeout far above its step time (minutes); the
drill arms it for the hang's step only, so that a slow step on a loaded machine cannot fire it.
In production ``on_hang`` prints the report and ends the process (os._exit), so that the launcher
restarts the job (or torchft drops the group); the drill's ``on_hang`` records it and releases
its simulated hang so that every process ends cleanly.
"""
from __future__ import annotations

import json
import threading
import time


class Watchdog:
    def __init__(self, store, rank: int, world_size: int, timeout_s: float | None, on_hang,
                 poll_s: float = 0.05):
        if timeout_s is not None and timeout_s <= 0 or poll_s <= 0:
            raise ValueError("timeout_s and poll_s must be positive seconds")
        self.store, self.rank, self.world = store, rank, world_size
        self.timeout_s, self.poll_s, self.on_hang = timeout_s, poll_s, on_hang
        self.where = {"step": -1, "phase": "start", "since": time.time()}
        self.fired = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="watchdog", daemon=True)

    def __enter__(self):
        self.at(-1, "start")
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def arm(self, timeout_s: float) -> None:
        """Fire once nothing has moved for ``timeout_s`` (None at construction: not armed)."""
        if not timeout_s > 0:
            raise ValueError("timeout_s must be positive seconds")
        self.timeout_s = timeout_s

    def at(self, step: int, phase: str) -> None:
        """Mark progress: this rank is now in ``phase`` of ``step``."""
        self.where = {"step": step, "phase": phase, "since": time.time()}
        self.store.set(f"watchdog/{self.rank}", json.dumps(self.where))

    def report(self) -> dict:
        now = time.time()
        out = {}
        for r in range(self.world):
            mark = json.loads(self.store.get(f"watchdog/{r}"))
            out[r] = {**mark, "stuck_s": now - mark["since"]}
        return out

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            armed = self.timeout_s is not None and not self.fired
            if armed and time.time() - self.where["since"] > self.timeout_s:
                self.fired = True
                self.on_hang(self.report())


def stuck_outside(report: dict, timeout_s: float, collective: str = "all_reduce") -> list[int]:
    """The ranks that have not moved for ``timeout_s`` and are not waiting in the collective."""
    return sorted(int(r) for r, mark in report.items()
                  if mark["phase"] != collective and mark["stuck_s"] >= timeout_s)
