"""Elastic membership on one machine: two torchrun agents (two "nodes"), one dies, one joins.

    python -m source_code.resilience.elastic --kill-after 32 --samples 240

Every agent runs ``torchrun --nnodes=MIN:MAX --nproc-per-node=1 --rdzv-backend=c10d
--max-restarts=3`` on elastic_train.py, meeting at one c10d rendezvous on 127.0.0.1 (the first
agent hosts it, as the first node of a job would). The drill:
1. agents A and B form a world of 2 (MAX nodes present: the rendezvous completes at once);
2. after ``--kill-after`` samples, node B dies (SIGKILL to its agent and its worker); A's worker
   fails in its next all-reduce, A restarts its workers (one of ``--max-restarts``), the
   rendezvous drops B when its heartbeats stop and completes with A alone (MIN nodes reached);
   the new world of 1 resumes from the last checkpoint, resharded;
3. once the world of 1 steps, agent C starts (a node comes back); A sees a node waiting and restarts its
   *healthy* worker (a membership change, not counted as a restart); the world is 2 again.
The step logs give the summary: the worlds, each start's restart count, and every sample of
the epoch counted in the run's history (steps a kill undid are not in it): exactly once.
The last line: ``summary: worlds=2,1,2 restart_counts=A0+B0,A1,A1+C0 ... exactly_once=1``.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

from source_code import processes
from source_code.cli import Parser, nonnegative_int, positive_int
from source_code.distributed import free_port
from source_code.errors import LaunchError, run_main
from source_code.resilience import common, elastic_history

# a dead node leaves after keep_alive_interval x keep_alive_max_attempt seconds without a
# heartbeat; a round with MIN..MAX-1 nodes waits last_call_timeout for more (defaults: 5 x 3, 30)
RDZV_CONF = "join_timeout=60,last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=3"
AGENT_LINES = ("group_world_size=", "restart_count=", "will restart worker group", "world ", "epoch done")


class Agent:
    """One torchrun agent (a node) whose output is kept and, where it matters, streamed."""

    def __init__(self, name: str, cmd: list[str], env: dict, stream: bool):
        self.name, self.lines = name, []
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=env, start_new_session=True)
        self.reader = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.reader.start()

    def _read(self, stream: bool) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            if stream and any(key in line for key in AGENT_LINES):
                print(f"node {self.name}: {short(line)}", flush=True)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)


def short(line: str) -> str:
    """torchrun's log line without its logger prefix, cut before the rendezvous's addresses."""
    text = line.split("] ", 1)[-1].strip()
    return text.split(" master_addr=")[0]


def agent_command(port: int, run_id: str, min_nodes: int, max_nodes: int, max_restarts: int,
                  worker_args: list, host: bool) -> list[str]:
    """One node's torchrun. ``host``: this agent serves the rendezvous store (on one machine every
    agent would think the endpoint is its own, so the others are told they are not)."""
    conf = f"{RDZV_CONF},is_host={str(host).lower()}"
    return [sys.executable, "-m", "torch.distributed.run", f"--nnodes={min_nodes}:{max_nodes}",
            "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
            f"--rdzv-id={run_id}", f"--rdzv-conf={conf}", f"--max-restarts={max_restarts}",
            "--monitor-interval=0.2", "-m", "source_code.resilience.elastic_train", *map(str, worker_args)]


def _wait_for(test, what: str, timeout: float, agents) -> None:
    end = time.time() + timeout
    while not test():
        if time.time() > end:
            tail = "".join(line for a in agents for line in a.lines[-15:])
            raise processes.ProcessesFailed(f"elastic drill: no {what} within {timeout:.0f} s\n{tail}")
        time.sleep(0.05)


def drill(kill_after: int = 32, samples: int = 240, batch_size: int = 8, sample_seconds: float = 0.025,
          max_restarts: int = 3, workdir: str | None = None, stream: bool | None = None,
          timeout: float = 120) -> dict:
    """Run the three-agent drill; the step logs' verdict (elastic_history.summarise) and the agents' lines."""
    if kill_after % batch_size or batch_size % 2 or kill_after >= samples // 2:
        raise ValueError("kill_after: whole global batches of an even size, in the epoch's first half")
    stream = processes.in_notebook() if stream is None else stream
    workdir = workdir or tempfile.mkdtemp(prefix="elastic_")
    logs, ckpt = os.path.join(workdir, "logs"), os.path.join(workdir, "checkpoints")
    port = free_port()
    worker_args = ["--checkpoint-dir", ckpt, "--log-dir", logs, "--samples", samples,
                   "--batch-size", batch_size, "--sample-seconds", sample_seconds]
    cmd = lambda host: agent_command(port, f"elastic-{port}", 1, 2, max_restarts, worker_args, host)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "LOGLEVEL": "INFO",
           "WORKSHOP_DEVICE": "cpu",
           # each attempt's workers get a store of their own (not the dead attempt's addresses)
           "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    read = lambda: elastic_history.read(logs)
    agents = []
    try:
        agents.append(Agent("A", cmd(True), env, stream))                     # A hosts the store
        agents.append(Agent("B", cmd(False), env, stream))
        _wait_for(lambda: any(s["world"] == 2 and s["consumed"] >= kill_after for s in read()["step"]),
                  f"step past sample {kill_after} in a world of 2", timeout, agents)
        b = agents[1]
        for start in read()["start"]:
            if start["agent"] == b.proc.pid:
                os.kill(start["pid"], signal.SIGKILL)                         # node B dies ...
        b.kill()                                                              # ... agent and all
        if stream:
            print("node B: killed (SIGKILL to its agent and its worker)", flush=True)
        _wait_for(lambda: any(s["world"] == 1 for s in read()["step"]), "step in a world of 1", timeout, agents)
        agents.append(Agent("C", cmd(False), env, stream))       # a node joins (it takes seconds to start)
        if stream:
            print("node C: started", flush=True)
        for a in (agents[0], agents[2]):
            a.proc.wait(timeout)
    finally:
        for a in agents:
            a.kill()
            a.proc.wait()
            a.reader.join(5)
            with open(os.path.join(workdir, f"agent_{a.name}.log"), "w") as f:   # all it said
                f.writelines(a.lines)
    bad = [(a.name, a.proc.returncode) for a in (agents[0], agents[2]) if a.proc.returncode != 0]
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
    res["reference_loss"] = elastic_history.reference_loss(samples, batch_size)
    return res


def summary_line(r: dict) -> str:
    return (f"summary: worlds={','.join(str(w['size']) for w in r['worlds'])} "
            f"restart_counts={','.join('+'.join(f'{n}{c}' for n, c in w['restarts'].items()) for w in r['worlds'])} "
            f"recomputed={r['recomputed']} "
            f"seen={r['seen']} unique={r['unique']} expected={r['expected']} "
            f"loss_vs_one_process={abs(r['final_loss'] - r['reference_loss']):.1e} "
            f"exactly_once={int(r['seen'] == r['unique'] == r['expected'])}")


# seconds of work world 1 must have left when node B dies for node C to join in time: 64 samples
# (1.2 s left) ended before C joined, 240 (5.2 s, the default) did not, on 2 loaded CPU cores
JOIN_S = 4.0


def main(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--kill-after", type=positive_int, default=32, help="samples before node B dies")
    p.add_argument("--samples", type=positive_int, default=240)
    p.add_argument("--batch-size", type=positive_int, default=8, help="global batch (even: 1 or 2 nodes)")
    p.add_argument("--sample-seconds", type=float, default=0.025, help="compute time per sample on a rank")
    p.add_argument("--max-restarts", type=nonnegative_int, default=3)
    a = p.parse_args(argv)
    if a.batch_size % 2 or a.kill_after % a.batch_size:
        raise LaunchError("error: --batch-size must be even and divide --kill-after")
    if a.kill_after >= a.samples // 2:
        raise LaunchError("error: --kill-after must be in the first half of the epoch (below --samples / 2)")
    left_s = (a.samples - a.kill_after) * a.sample_seconds   # world 1's work before node C must join
    if left_s < JOIN_S:
        raise LaunchError(f"error: the epoch would end {left_s:.1f} s after node B dies, before a new node "
                          f"can join (a node takes about {JOIN_S:.0f} s to start here); raise --samples or "
                          "--sample-seconds")
    if a.max_restarts < 1 or not a.sample_seconds >= 0:
        raise LaunchError("error: --max-restarts must be >= 1 (a lost node fails a worker) and --sample-seconds >= 0")
    print(summary_line(drill(a.kill_after, a.samples, a.batch_size, a.sample_seconds, a.max_restarts)))
    return 0


if __name__ == "__main__":
    run_main(main)
