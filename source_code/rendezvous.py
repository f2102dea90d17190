"""Where the processes of a job meet: MASTER_ADDR:MASTER_PORT, and the one-line errors around it.

torchrun gathers its processes itself. A job started another way (srun without torchrun, or
variables set by hand) meets here: ``slurm_defaults`` derives MASTER_ADDR/MASTER_PORT from the
Slurm step, ``meet`` hosts or joins a TCPStore and names the ranks that never arrive instead of
waiting silently; ``decide_together`` lets rank 0 make one decision from every rank's view
(the device policy's) before the process group exists, on that store or on torchrun's
(``agent_store``). ``distributed.whoami`` calls them; ``free_port`` serves demos and tests.
"""
from __future__ import annotations

import datetime
import os
import socket
import subprocess
import time

import torch.distributed as dist

from source_code.errors import LaunchError


def slurm_defaults(env) -> None:
    """Under srun without torchrun: MASTER_ADDR = first host of the step, MASTER_PORT from the job id."""
    if "MASTER_ADDR" not in env:
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
        if not nodelist:
            raise LaunchError("error: MASTER_ADDR not set; export MASTER_ADDR=$(scontrol show "
                              "hostnames \"$SLURM_JOB_NODELIST\" | head -n 1) before srun")
        hosts = subprocess.run(["scontrol", "show", "hostnames", nodelist], check=True,
                               capture_output=True, text=True).stdout.split()
        env["MASTER_ADDR"] = hosts[0]
    env.setdefault("MASTER_PORT", str(job_port(env)))


def job_port(env) -> int:
    """A port derived from the job id, so two jobs sharing a node do not collide: the same
    formula as slurm/common.sh (20000-29999, below the kernel's ephemeral ports)."""
    return 20000 + int(env.get("SLURM_JOB_ID") or 0) % 10000


def port_is_free(port: int, host: str = "") -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def free_port() -> int:
    """A TCP port nobody listens on right now (for demos that start their own processes)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def meet(rank: int, world: int) -> dist.Store:
    """Meet the other ranks at MASTER_ADDR:MASTER_PORT, or fail in one line naming who is missing.

    Rank 0 hosts a TCPStore; every rank writes ``arrived/<rank>``; rank 0 waits at most
    WORKSHOP_RENDEZVOUS_TIMEOUT seconds (default 120) for all of them, saying every 10 s whom
    it waits for, then tells the others whether the job goes on. Without this a missing peer
    is a silent wait of many minutes.
    """
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    wait_s = float(os.environ.get("WORKSHOP_RENDEZVOUS_TIMEOUT", "120"))
    where = f"MASTER_ADDR:MASTER_PORT={addr}:{port}"
    try:
        store = dist.TCPStore(addr, port, world, is_master=rank == 0, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=wait_s))
    except Exception as exc:
        if rank == 0:
            raise LaunchError(f"error: rank 0 cannot listen on {where} ({exc}); export another "
                              "MASTER_PORT (below 32768)") from None
        raise LaunchError(f"error: rank {rank} found no rank 0 at {where} within {wait_s:.0f} s; "
                          "start rank 0 with the same MASTER_ADDR/MASTER_PORT (or raise "
                          "WORKSHOP_RENDEZVOUS_TIMEOUT)", every_rank=True) from None
    store.set_timeout(datetime.timedelta(seconds=2 * wait_s + 30))
    store.set(f"arrived/{rank}", "yes")
    if rank == 0:
        start, every = time.monotonic(), min(10.0, wait_s / 3)  # a silent wait looks like a hang
        said = 0
        while not store.check([f"arrived/{r}" for r in range(world)]):
            waited = time.monotonic() - start
            if waited >= (said + 1) * every:
                said += 1
                missing = [r for r in range(world) if not store.check([f"arrived/{r}"])]
                print(f"rank 0: waiting for rank(s) {', '.join(map(str, missing))} at {where} "
                      f"({waited:.0f} of {wait_s:.0f} s)", flush=True)
            if waited > wait_s:
                missing = [r for r in range(world) if not store.check([f"arrived/{r}"])]
                store.set("verdict", "missing")
                raise LaunchError(
                    f"error: rank(s) {', '.join(map(str, missing))} of WORLD_SIZE={world} never "
                    f"reached {where} within {wait_s:.0f} s; start every rank with the same "
                    "MASTER_ADDR/MASTER_PORT/WORLD_SIZE (or raise WORKSHOP_RENDEZVOUS_TIMEOUT)")
            time.sleep(0.05)
        store.set("verdict", "go")
        return store
    try:
        verdict = store.get("verdict")  # blocks until rank 0 has decided
    except Exception:
        verdict = b"lost"
    if verdict != b"go":
        raise LaunchError(f"error: rank {rank}: rank 0 at {where} stopped waiting for the "
                          "missing ranks (its message names them)", every_rank=True)
    return store


def agent_store() -> dist.Store | None:
    """Under torchrun: a client of the store its agent serves at MASTER_ADDR:MASTER_PORT (the
    one ``init_process_group`` joins too), under a prefix of our own per restart; else None."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    wait_s = float(os.environ.get("WORKSHOP_RENDEZVOUS_TIMEOUT", "120"))
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None, False,
                          timeout=datetime.timedelta(seconds=wait_s), wait_for_workers=False)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"workshop/attempt_{attempt}", store)


def decide_together(store: dist.Store, rank: int, world: int, mine: str, decide) -> str:
    """Every rank posts ``mine``; rank 0 waits for all of them, posts ``decide(all views)``; every
    rank returns that one answer. A rank that never posts is named in one line."""
    store.set(f"view/{rank}", mine)
    if rank == 0:
        keys = [f"view/{r}" for r in range(world)]
        wait_s = float(os.environ.get("WORKSHOP_RENDEZVOUS_TIMEOUT", "120"))
        try:
            store.wait(keys, datetime.timedelta(seconds=wait_s))
        except Exception:
            missing = [r for r, k in enumerate(keys) if not store.check([k])]
            raise LaunchError(f"error: rank(s) {', '.join(map(str, missing))} never said where they "
                              f"compute within {wait_s:.0f} s; check their output for an earlier error") from None
        store.set("decision", decide([store.get(k).decode() for k in keys]))
    try:
        answer = store.get("decision").decode()
    except Exception:
        raise LaunchError(f"error: rank {rank}: no device decision from rank 0 (its output says "
                          "why)", every_rank=True) from None
    # rank 0 may serve the store: it stays until every rank has the answer, else a rank that
    # reads late finds no store when the answer is an error that rank 0 stops on at once
    store.set(f"read/{rank}", "1")
    if rank == 0:
        try:
            store.wait([f"read/{r}" for r in range(world)], datetime.timedelta(seconds=30))
        except Exception:
            pass            # a rank that died after posting its view: the answer stands
    return answer
