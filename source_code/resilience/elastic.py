"""Elastic membership on one machine: three torchrun agents (three "nodes"): two start, one dies, one joins.

    python -m source_code.resilience.elastic --kill-after 32 --samples 128

Every agent runs ``torchrun --nnodes=MIN:MAX --nproc-per-node=1 --rdzv-backend=c10d
--max-restarts=3`` on elastic_train.py, meeting at one c10d rendezvous on 127.0.0.1 (the first
agent hosts it, as the first node of a job would). Each agent is torchrun's own main() in a
process forked with torch imported (forked.py), and forks its workers (torchrun's
``--start-method=fork --run-path``): on a cluster each would import torch anew, seconds a
start that the drill does not measure. The drill:
1. agents A and B form a world of 2. A round completes at once with MAX nodes in it; an agent
   alone in it for ``last_call_timeout`` (its peer still starting, or still stopping a worker
   for the next round) closes it alone, and its lone worker waits at sample 0 (``--hold-at
   0,..``) until the other's arrival restarts it: the rounds may go back and forth
   (``lone_start_rounds`` counts them) until both are in one; none trains a step;
2. once the checkpoint after ``--kill-after`` samples is the latest, node B dies: its worker
   SIGKILLs its agent and itself (``--die-at``, resilience/faults.py: decided by the node, not
   by a poller); A's worker fails in its next all-reduce, A restarts its workers (one of
   ``--max-restarts``), the rendezvous drops B when its heartbeats stop and completes with A
   alone (MIN nodes reached); the new world of 1 resumes from that checkpoint;
3. the world of 1 takes one step and waits there (``--hold-at``); then agent C starts (a node
   comes back), A sees a node waiting and restarts its *healthy* worker (a membership change,
   not counted as a restart); the world is 2 again.
The step logs give the summary: the worlds, each start's restart count, and every sample of
the epoch counted in the run's history (steps a kill undid are not in it): exactly once.
The last line: ``summary: worlds=2,1,2 restart_counts=A0+B0,A1,A1+C0 ... exactly_once=1``.
"""
from __future__ import annotations

import os
import sys
import tempfile
import threading
import time

from source_code import processes
from source_code.cli import Parser, nonnegative_int, positive_int
from source_code.distributed import free_port
from source_code.errors import LaunchError, run_main
from source_code.resilience import elastic_history, elastic_train, forked

# the rendezvous's timeouts (torchrun's defaults: 600, 30, 5, 3), printed by the notebook:
# a node whose agent sent no heartbeat for keep_alive_interval x keep_alive_max_attempt seconds
# is dead (it holds the next round that long; a live agent starved that long would be dropped);
# a round with MIN..MAX-1 nodes waits last_call_timeout for more before it completes: above the
# rendezvous's own poll (an agent waiting for the next round looks once a second), so that it
# can join before the round closes (at 1 s the agents often closed rounds alone, in turn)
RDZV_TIMEOUTS = {"join_timeout": 60, "last_call_timeout": 2, "keep_alive_interval": 1, "keep_alive_max_attempt": 5}
RDZV_CONF = ",".join(f"{k}={v}" for k, v in RDZV_TIMEOUTS.items())
AGENT_LINES = ("group_world_size=", "restart_count=", "will restart worker group")   # torchrun's


def shown(line: str) -> bool:
    """A line the drill streams: torchrun's about its rendezvous and restarts, the worker's own."""
    return any(key in line for key in AGENT_LINES) or short(line).startswith("world ")


_PRINT = threading.Lock()       # one line at a time from the agents' reader threads


def say(text: str) -> None:
    with _PRINT:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()


class Agent:
    """One torchrun agent (a node) whose output is kept and, where it matters, streamed."""

    def __init__(self, name: str, argv: list, env: dict, stream: bool, workdir: str):
        self.name = name
        out = os.path.join(workdir, f"agent_{name}.log")             # all it says
        self.proc = forked.start("torch.distributed.run", argv, out, env)
        self.tail = forked.Tail(out, self.proc, self._line if stream else None)

    @property
    def lines(self) -> list:
        return self.tail.lines

    def _line(self, line: str) -> None:
        if shown(line):
            say(f"node {self.name}: {short(line)}")

    def kill(self) -> None:
        forked.kill(self.proc)


def short(line: str) -> str:
    """torchrun's log line without its logger prefix, cut before the rendezvous's addresses."""
    text = line.split("] ", 1)[-1].strip()
    return text.split(" master_addr=")[0]


def agent_command(port: int, run_id: str, min_nodes: int, max_nodes: int, max_restarts: int,
                  worker_args: list, host: bool) -> list[str]:
    """One node's torchrun arguments. ``host``: this agent serves the rendezvous store (on one
    machine every agent would think the endpoint is its own, so the others are told they are not)."""
    conf = f"{RDZV_CONF},is_host={str(host).lower()}"
    return [f"--nnodes={min_nodes}:{max_nodes}", "--nproc-per-node=1", "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={run_id}", f"--rdzv-conf={conf}",
            f"--max-restarts={max_restarts}", "--monitor-interval=0.2", "--start-method=fork",
            "--run-path", elastic_train.__file__, *map(str, worker_args)]


def _wait_for(test, what: str, timeout: float, agents) -> None:
    end = time.time() + timeout
    while not test():
        if time.time() > end:
            tail = "".join(line for a in agents for line in a.lines[-15:])
            raise processes.ProcessesFailed(f"elastic drill: no {what} within {timeout:.0f} s\n{tail}")
        time.sleep(0.05)


def check(kill_after: int, samples: int, batch_size: int) -> None:
    if batch_size % 2 or kill_after % batch_size or kill_after <= 0:
        raise LaunchError("error: --batch-size must be even and divide --kill-after (> 0)")
    if kill_after + 2 * batch_size > samples // batch_size * batch_size:
        raise LaunchError(f"error: --samples {samples} leaves no step for the world that a joining node "
                          f"makes: it must exceed --kill-after + 2 x --batch-size ({kill_after + 2 * batch_size})")


def drill(kill_after: int = 32, samples: int = 128, batch_size: int = 8, sample_seconds: float = 0.025,
          max_restarts: int = 3, workdir: str | None = None, stream: bool | None = None,
          timeout: float = 120) -> dict:
    """Run the three-agent drill; the step logs' verdict (elastic_history.summarise) and the agents' lines."""
    check(kill_after, samples, batch_size)
    stream = processes.in_notebook() if stream is None else stream
    workdir = workdir or tempfile.mkdtemp(prefix="elastic_")
    os.makedirs(workdir, exist_ok=True)             # the agents' logs go there from their start
    logs, ckpt = os.path.join(workdir, "logs"), os.path.join(workdir, "checkpoints")
    port, hold_at = free_port(), kill_after + batch_size
    worker_args = ["--checkpoint-dir", ckpt, "--log-dir", logs, "--samples", samples,
                   "--batch-size", batch_size, "--sample-seconds", sample_seconds, "--hold-at", f"0,{hold_at}"]
    cmd = lambda host, *more: agent_command(port, f"elastic-{port}", 1, 2, max_restarts,
                                            worker_args + list(more), host)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "LOGLEVEL": "INFO",
           "WORKSHOP_DEVICE": "cpu",
           # each attempt's workers get a store of their own (not the dead attempt's addresses)
           "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    read = lambda: elastic_history.read(logs)
    agents = []
    try:
        agents.append(Agent("A", cmd(True), env, stream, workdir))              # A hosts the store
        agents.append(Agent("B", cmd(False, "--die-at", kill_after), env, stream, workdir))   # dies at kill_after
        _wait_for(lambda: agents[1].proc.exitcode is not None, f"death of node B at sample {kill_after}",
                  timeout, agents)
        if stream:
            say(f"node B: died after sample {kill_after} (its worker SIGKILLed its agent and itself)")
        held = os.path.join(ckpt, f"step_{hold_at:06d}")        # world 1 waits there for a node to join
        _wait_for(lambda: elastic_train.latest_checkpoint(ckpt) == held, f"world of 1 at sample {hold_at}",
                  timeout, agents)
        agents.append(Agent("C", cmd(False), env, stream, workdir))       # a node joins
        if stream:
            say("node C: started")
        for a in (agents[0], agents[2]):
            a.proc.join(timeout)
    finally:
        for a in agents:
            a.kill()
            a.tail.join()
    bad = [(a.name, a.proc.exitcode) for a in (agents[0], agents[2]) if a.proc.exitcode != 0]
    if bad:
        raise processes.ProcessesFailed(f"elastic drill: agents ended badly {bad}\n"
                                        + "".join(agents[0].lines[-25:]))
    res = elastic_history.summarise(read(), samples, batch_size)
    names = {a.proc.pid: a.name for a in agents}
    for w in res["worlds"]:
        w["restarts"] = {names.get(pid, str(pid)): count for pid, count in sorted(w["restarts"].items(),
                                                                                  key=lambda kv: names.get(kv[0], ""))}
    res["agent_lines"] = {a.name: [short(x) for x in a.lines if any(k in x for k in AGENT_LINES[:3])]
                          for a in agents}
    res["lone_start_rounds"] = lone_start_rounds(res["agent_lines"])
    res["reference_loss"] = elastic_history.reference_loss(samples, batch_size)
    res.update(kill_after=kill_after, hold_at=hold_at)
    return res


def lone_start_rounds(agent_lines: dict, names=("A", "B")) -> dict:
    """Per agent, the rounds it was given alone (``group_world_size=1``) before its first world of 2."""
    counts = {}
    for name in names:
        sizes = [line.split("group_world_size=")[1].split()[0] for line in agent_lines.get(name, [])
                 if "group_world_size=" in line]
        counts[name] = sizes.index("2") if "2" in sizes else len(sizes)
    return counts


def summary_line(r: dict) -> str:
    return (f"summary: worlds={','.join(str(w['size']) for w in r['worlds'])} "
            f"restart_counts={','.join('+'.join(f'{n}{c}' for n, c in w['restarts'].items()) for w in r['worlds'])} "
            f"recomputed={r['recomputed']} "
            f"seen={r['seen']} unique={r['unique']} expected={r['expected']} "
            f"loss_vs_one_process={abs(r['final_loss'] - r['reference_loss']):.1e} "
            f"exactly_once={int(r['seen'] == r['unique'] == r['expected'])}")


def main(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--kill-after", type=positive_int, default=32, help="samples before node B dies")
    p.add_argument("--samples", type=positive_int, default=128)
    p.add_argument("--batch-size", type=positive_int, default=8, help="global batch (even: 1 or 2 nodes)")
    p.add_argument("--sample-seconds", type=float, default=0.025, help="compute time per sample on a rank")
    p.add_argument("--max-restarts", type=nonnegative_int, default=3)
    a = p.parse_args(argv)
    check(a.kill_after, a.samples, a.batch_size)
    if a.max_restarts < 1 or not a.sample_seconds >= 0:
        raise LaunchError("error: --max-restarts must be >= 1 (a lost node fails a worker) and --sample-seconds >= 0")
    print(summary_line(drill(a.kill_after, a.samples, a.batch_size, a.sample_seconds, a.max_restarts)))
    return 0


if __name__ == "__main__":
    run_main(main)
