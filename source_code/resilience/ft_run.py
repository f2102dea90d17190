"""Per-step fault tolerance, run: a lighthouse on loopback, replica groups, one killed and restarted.

    python -m source_code.resilience.ft_run --replicas 2 --steps 40 --kill-at-step 10

The harness plays the part of the cluster: it starts torchft's lighthouse (the service every
group asks "who is alive this step?") in this process, bound to 127.0.0.1; it starts each
replica group (source_code/resilience/ft_replica.py); when the drill kills one, it starts that
group again at once, as torchrun or Slurm would restart a failed node's processes; at the end
it stops the lighthouse and every process it started, also after an error or an interrupt.
What happened is read back from the replicas' JSON-lines logs (recovery.py measures it).
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time

from source_code.cli import Parser, nonnegative_int, positive_int
from source_code.errors import LaunchError, run_main
from source_code.processes import in_notebook
from source_code.resilience import common, recovery

QUIET = {"RUST_LOG": "error"}      # torchft's Rust side logs every quorum at INFO


def require_torchft() -> None:
    """Stop in one line, before any process starts, where torchft cannot be imported."""
    import importlib.util
    import torch
    if importlib.util.find_spec("torchft") is None:
        raise LaunchError(f"error: torchft is not installed here (torch {torch.__version__}; torchft 0.2 "
                          "needs torch 2.7 or newer): pip install --no-deps torchft==0.2.0 and the "
                          "opentelemetry packages of requirements.txt, or use the workshop's environment (make venv)")


def start_lighthouse(min_replicas: int = 1):
    os.environ.update(QUIET)
    from torchft._torchft import LighthouseServer
    # heartbeat_timeout: how long a silent group counts as alive (a dead one stops beating, and
    # after this the survivors' quorum no longer waits for it); join_timeout: how long a quorum
    # waits for a group that still beats but has not asked yet. Short, on a loaded machine a
    # slow but live group is left out, forms a quorum of its own, and the groups train apart
    # (split brain: the bitwise check at the end catches it). So: long join, short heartbeat.
    return LighthouseServer(bind="127.0.0.1:0", min_replicas=min_replicas, join_timeout_ms=5000,
                            heartbeat_timeout_ms=1000)


def _pump(proc, lines: list, stream: bool) -> None:
    for line in proc.stdout:
        lines.append(line)
        if stream and line.startswith("replica "):     # the replicas' own lines, not library noise
            print(line, end="", flush=True)


def run(replicas: int = 2, steps: int = 40, kill_at: int = 10, victim: int = 1,
        step_seconds: float = 0.05, batch_size: int = 32, workdir=None, stream=None,
        timeout: float = 120) -> dict:
    """Run the drill; return the logs' events and ``recovery.ft_metrics`` of them."""
    stream = in_notebook() if stream is None else stream
    workdir = workdir or tempfile.mkdtemp(prefix="ft_run_")
    from torch.distributed import TCPStore
    gate = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    lighthouse = start_lighthouse()
    procs, threads, lines = {}, [], []
    logs = [os.path.join(workdir, f"replica_{r}.jsonl") for r in range(replicas)]
    for path in logs:
        if os.path.exists(path):
            os.remove(path)

    def launch(r: int, attempt: int):
        cmd = [sys.executable, "-m", "source_code.resilience.ft_replica",
               "--lighthouse", lighthouse.address(), "--replica", str(r), "--replicas", str(replicas),
               "--steps", str(steps), "--batch-size", str(batch_size), "--step-seconds", str(step_seconds),
               "--attempt", str(attempt), "--log", logs[r],
               "--kill-at-step", str(kill_at if r == victim else 0)]
        if attempt == 0:
            cmd += ["--gate", f"127.0.0.1:{gate.port}"]
        env = {**os.environ, **QUIET, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        t = threading.Thread(target=_pump, args=(p, lines, stream), daemon=True)
        t.start()
        procs[r], _ = p, threads.append(t)
        return p

    deadline = time.time() + timeout
    restarted = {}
    try:
        for r in range(replicas):
            launch(r, 0)
        while any(p.poll() is None for p in procs.values()) or len(restarted) < (1 if kill_at else 0):
            for r, p in list(procs.items()):
                if p.poll() == -9 and r not in restarted:      # killed by the drill: restart it
                    restarted[r] = time.time()
                    launch(r, 1)
                elif p.poll() not in (None, 0, -9):
                    raise RuntimeError(f"replica {r} failed (exit {p.returncode}):\n"
                                       + "".join(lines[-20:]))
            if time.time() > deadline:
                raise TimeoutError(f"ft_run did not finish within {timeout:.0f} s:\n" + "".join(lines[-20:]))
            time.sleep(0.05)
    finally:
        for p in procs.values():                 # nothing outlives the run ...
            if p.poll() is None:
                p.kill()
            p.wait()
        for t in threads:
            t.join(timeout=5)
        lighthouse.shutdown()                    # ... the lighthouse included
    events = {r: common.read_log(path) for r, path in enumerate(logs)}
    return {"events": events, "restarted_at": restarted, "victim": victim, "kill_at": kill_at,
            **recovery.ft_metrics(events, victim)}


def main(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--replicas", type=positive_int, default=2)
    p.add_argument("--steps", type=positive_int, default=40)
    p.add_argument("--kill-at-step", type=nonnegative_int, default=10)
    p.add_argument("--step-seconds", type=float, default=0.05)
    args = p.parse_args(argv)
    if args.replicas < 2:
        raise LaunchError("error: --replicas must be >= 2: a killed group needs a live peer to heal from")
    if not 0 < args.kill_at_step < args.steps:
        raise LaunchError(f"error: --kill-at-step must be in 1..{args.steps - 1} (below --steps)")
    require_torchft()
    res = run(args.replicas, args.steps, args.kill_at_step, step_seconds=args.step_seconds)
    print(f"summary: ft_steps_lost={res['steps_lost']} seconds_without_progress="
          f"{res['seconds_without_progress']:.2f} discarded_attempts={res['discarded']} "
          f"heal_bitwise_equal={int(res['bitwise_equal'])}")
    return 0


if __name__ == "__main__":
    run_main(main)
