"""Per-step fault tolerance, run: a lighthouse on loopback, replica groups, one killed and restarted.

    python -m source_code.resilience.ft_run --replicas 2 --steps 40 --kill-at-step 10

The harness plays the part of the cluster: it starts torchft's lighthouse (the service every
group asks "who is alive this step?") in this process, bound to 127.0.0.1; it starts each
replica group (source_code/resilience/ft_replica.py, ``python -m`` as on a node, forked from a
server that has torch imported: forked.py); when the drill kills one, it starts that group
again once the others have committed a step without it (as a replacement node would come
back, after the lighthouse's heartbeat timeout: the harness's choice, reported as
``replacement_s``, when it started the group and when its process was up); at the end it stops the lighthouse and
every process it started, also after an error or an interrupt. What happened is read back
from the replicas' JSON-lines logs (recovery.py measures it).
"""
from __future__ import annotations

import os
import tempfile
import time

from source_code.cli import Parser, nonnegative_int, positive_int
from source_code.errors import LaunchError, run_main
from source_code.processes import in_notebook
from source_code.resilience import common, forked, recovery

QUIET = {"RUST_LOG": "error"}      # torchft's Rust side logs every quorum at INFO
os.environ.setdefault("RUST_LOG", "error")   # read once, when torchft's Rust module first loads


def require_torchft() -> None:
    """Stop in one line, before any process starts, where torchft cannot be imported."""
    import importlib.util
    import torch
    if importlib.util.find_spec("torchft") is None:
        raise LaunchError(f"error: torchft is not installed here (torch {torch.__version__}; torchft 0.2 "
                          "needs torch 2.7 or newer): pip install --no-deps torchft==0.2.0 and the "
                          "opentelemetry packages of requirements.txt, or use the workshop's environment (make venv)")


# The lighthouse's and the managers' timeouts, and what each one trades (reported by run()):
HEARTBEAT_TIMEOUT_S = 2.0   # a group silent this long is dead: a dead group holds the survivors'
#                             next quorum this long; a live one whose heartbeats (every 0.1 s, from
#                             its manager's own thread) stall this long is dropped and must heal
JOIN_TIMEOUT_S = 5.0        # a new quorum waits this long for groups that beat but have not asked
QUORUM_TIMEOUT_S = 30.0     # a group waits this long for its quorum (above the heartbeat timeout)
COLLECTIVE_TIMEOUT_S = 5.0  # an all-reduce, a commit vote or a heal that takes longer fails the step


def start_lighthouse(min_replicas: int = 1, bind: str = "127.0.0.1:0"):
    from torchft._torchft import LighthouseServer
    return LighthouseServer(bind=bind, min_replicas=min_replicas, join_timeout_ms=int(1e3 * JOIN_TIMEOUT_S),
                            heartbeat_timeout_ms=int(1e3 * HEARTBEAT_TIMEOUT_S))


def timeouts() -> dict:
    return {"heartbeat_timeout_s": HEARTBEAT_TIMEOUT_S, "join_timeout_s": JOIN_TIMEOUT_S,
            "quorum_timeout_s": QUORUM_TIMEOUT_S, "collective_timeout_s": COLLECTIVE_TIMEOUT_S,
            "heartbeat_interval_s": 0.1}


def check(replicas: int, steps: int, kill_at: int, batch_size: int) -> None:
    """Every flag error in one line, before any process starts."""
    if replicas < 2:
        raise LaunchError("error: --replicas must be >= 2: a killed group needs a live peer to heal from")
    if batch_size % replicas:
        raise LaunchError(f"error: --batch-size {batch_size} does not split over --replicas {replicas}: "
                          f"pick a batch size that {replicas} divides")
    if not 0 <= kill_at < steps:
        raise LaunchError(f"error: --kill-at-step must be in 0..{steps - 1} (below --steps)")


def _went_on_alone(logs: list, victim: int, replicas: int) -> bool:
    """Has a surviving group committed a step without ``victim`` (read from its step log)?"""
    return any(e.get("event") == "step" and e["committed"] and e["participants"] < replicas
               for r, path in enumerate(logs) if r != victim for e in common.read_log(path))


def run(replicas: int = 2, steps: int = 40, kill_at: int = 10, victim: int = 1,
        step_seconds: float = 0.05, batch_size: int = 32, workdir=None, stream=None,
        timeout: float = 180) -> dict:
    """Run the drill; return the logs' events and ``recovery.ft_metrics`` of them."""
    check(replicas, steps, kill_at, batch_size)
    stream = in_notebook() if stream is None else stream
    workdir = workdir or tempfile.mkdtemp(prefix="ft_run_")
    os.makedirs(workdir, exist_ok=True)
    from torch.distributed import TCPStore
    gate = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    lighthouse = start_lighthouse()
    procs, tails, lines = {}, [], []
    logs = [os.path.join(workdir, f"replica_{r}.jsonl") for r in range(replicas)]
    for path in logs:
        if os.path.exists(path):
            os.remove(path)

    def keep(line: str) -> None:
        lines.append(line)
        if stream and line.startswith("replica "):     # the replicas' own lines, not library noise
            print(line, end="", flush=True)

    def launch(r: int, attempt: int):
        argv = ["--lighthouse", lighthouse.address(), "--replica", str(r), "--replicas", str(replicas),
               "--steps", str(steps), "--batch-size", str(batch_size), "--step-seconds", str(step_seconds),
               "--attempt", str(attempt), "--log", logs[r], "--deadline", str(timeout), "--host", "127.0.0.1",
               "--timeout", str(COLLECTIVE_TIMEOUT_S), "--quorum-timeout", str(QUORUM_TIMEOUT_S),
               "--kill-at-step", str(kill_at if r == victim else 0)]
        if attempt == 0:
            argv += ["--gate", f"127.0.0.1:{gate.port}"]
        env = {**os.environ, **QUIET, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        out = os.path.join(workdir, f"replica_{r}_attempt_{attempt}.out")
        if os.path.exists(out):                  # a former run's lines are not this one's
            os.remove(out)
        p = forked.start("source_code.resilience.ft_replica", argv, out, env)
        procs[r] = p
        tails.append(forked.Tail(out, p, keep))
        return p

    deadline = time.time() + timeout + 30
    restarted = {}
    try:
        for r in range(replicas):
            launch(r, 0)
        while any(p.exitcode is None for p in procs.values()) or len(restarted) < (1 if kill_at else 0):
            for r, p in list(procs.items()):
                # killed by the drill: started again once the others went on without it, a choice
                # of this harness (a replacement node after the heartbeat timeout; torchrun's
                # restart in compare.py relaunches its workers as soon as its agent sees the
                # failure, which takes seconds too): run() reports both moments
                if p.exitcode == -9 and r not in restarted and _went_on_alone(logs, r, replicas):
                    restarted[r] = time.time()
                    launch(r, 1)
                elif p.exitcode not in (None, 0, -9):
                    raise RuntimeError(f"replica {r} failed (exit {p.exitcode}):\n"
                                       + "".join(lines[-20:]))
            if time.time() > deadline:
                raise TimeoutError(f"ft_run did not finish within {timeout:.0f} s:\n" + "".join(lines[-20:]))
            time.sleep(0.05)
    finally:
        for p in procs.values():                 # nothing outlives the run ...
            forked.kill(p)
        for t in tails:
            t.join()
        lighthouse.shutdown()                    # ... the lighthouse included
    events = {r: common.read_log(path) for r, path in enumerate(logs)}
    metrics = recovery.ft_metrics(events, victim, batch_size)
    up = [e["t"] for e in events[victim] if e.get("event") == "start" and e.get("attempt") == 1]
    # when the harness started the killed group again, and when its process was up (Manager built)
    back = {"launched": restarted[victim] - metrics["kill_t"] if victim in restarted else None,
            "up": up[0] - metrics["kill_t"] if up else None}
    return {"events": events, "restarted_at": restarted, "victim": victim, "kill_at": kill_at,
            "batch_size": batch_size, "replicas": replicas, "timeouts": timeouts(),
            "replacement_s": back, **metrics}


def main(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--replicas", type=positive_int, default=2)
    p.add_argument("--steps", type=positive_int, default=40)
    p.add_argument("--kill-at-step", type=nonnegative_int, default=10,
                   help="replica 1 dies in the all-reduce after this many steps (0: no kill)")
    p.add_argument("--batch-size", type=positive_int, default=32, help="global batch, split over the groups")
    p.add_argument("--step-seconds", type=float, default=0.05)
    args = p.parse_args(argv)
    check(args.replicas, args.steps, args.kill_at_step, args.batch_size)
    if not args.step_seconds >= 0:
        raise LaunchError("error: --step-seconds must be >= 0")
    require_torchft()
    res = run(args.replicas, args.steps, args.kill_at_step, step_seconds=args.step_seconds,
              batch_size=args.batch_size)
    print(f"summary: ft_steps_lost={res['steps_lost']} ft_discarded_steps={res['discarded']} "
          f"ft_samples_lost={res['samples_lost']} ft_samples_thrown_away={res['samples_thrown_away']} seconds_without_progress={res['seconds_without_progress']:.2f} "
          f"heartbeat_timeout_s={HEARTBEAT_TIMEOUT_S:.1f} heal_bitwise_equal={int(res['heal_bitwise_equal'])}")
    return 0


if __name__ == "__main__":
    run_main(main)
