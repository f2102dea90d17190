"""Notebook 00's exercise: write one round trip of the ping-pong, checked on 2 real processes.

    from source_code.basics.pingpong_exercise import check_round_trip
    check_round_trip(my_round_trip)

``round_trip(buf, rank)`` runs on both ranks of a 2-process gloo group: rank 0 sends ``buf``
to rank 1 and receives it back into ``buf``; rank 1 receives into ``buf`` and sends it back.
The check runs the learner's function in two forked processes (a function defined in a
notebook cell cannot be pickled for spawn, fork copies it), sends a different pattern in
every message, and stops instead of hanging when both ranks wait for each other: the group's
timeout bounds each send and receive (not the start-up, which a busy machine may stretch), and
a receive that times out is the hang. Solution: ``source_code/solutions/nb00_pingpong.py``.
"""
from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import queue as queue_mod

import torch
import torch.distributed as dist

from source_code.distributed import free_port

SIZES = (8, 65536, 4 * 2**20)  # bytes: latency-bound, middle, bandwidth-bound


START_S = 120  # the two processes meet within this (a generous bound: a busy machine is slow)


def _player(fn, rank: int, port: int, results, timeout: float) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    try:
        store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=datetime.timedelta(seconds=START_S))
        dist.init_process_group("gloo", store=store, rank=rank, world_size=2,
                                timeout=datetime.timedelta(seconds=timeout))  # each send / recv
        report = []
        for k, n in enumerate(SIZES):
            sent = torch.arange(n, dtype=torch.int64).remainder(251).to(torch.uint8) + k
            buf = sent.clone() if rank == 0 else torch.zeros(n, dtype=torch.uint8)
            fn(buf, rank)
            # rank 0 must get its message back; rank 1 must have received it
            report.append(bool(torch.equal(buf, sent)))
        results.put((rank, report, ""))
        dist.destroy_process_group()
    except Exception as err:  # noqa: BLE001 - reported to the parent as text
        results.put((rank, None, f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"))


def run_round_trips(fn, timeout: float = 30) -> dict:
    """{rank: [ok per size] or error text}; "hang" for both ranks when a send or receive waited
    ``timeout`` seconds (the group's timeout), or when a rank never answers at all."""
    ctx = mp.get_context("fork")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_player, args=(fn, r, port, results, timeout), daemon=True) for r in (0, 1)]
    for p in procs:
        p.start()
    out = {}
    try:
        for _ in procs:  # a bound for a rank stuck outside send and recv (start-up, a loop of its own)
            rank, report, error = results.get(timeout=2 * START_S + 2 * len(SIZES) * timeout)
            out[rank] = report if report is not None else error
    except queue_mod.Empty:
        pass
    finally:
        for p in procs:
            p.join(timeout=1)
            if p.is_alive():
                p.kill()
                p.join()
    if any("Timed out" in v for v in out.values() if isinstance(v, str)):
        return {0: "hang", 1: "hang"}  # a receive waited out the group's timeout: the ranks waited for each other
    for r in (0, 1):
        out.setdefault(r, "hang")
    return out


def check_round_trip(fn, timeout: float = 30) -> str:
    try:
        fn(torch.zeros(1, dtype=torch.uint8), 0)
    except NotImplementedError:
        raise NotImplementedError("exercise not done yet: fill in my_round_trip, then run this cell again") from None
    except Exception:  # noqa: BLE001 - without a process group a real answer fails here: fine
        pass
    out = run_round_trips(fn, timeout)
    if "hang" in out.values():
        raise AssertionError(f"the ranks still waited for each other after {timeout:.0f} s: every send needs "
                             "a matching recv on the other rank, in an order that lets one of them start "
                             "(hint: which rank speaks first, and does the other answer?)")
    errors = [f"rank {r}: {v}" for r, v in out.items() if isinstance(v, str)]
    if errors:
        raise AssertionError("a rank failed: " + "; ".join(errors))
    if not all(out[1]):
        raise AssertionError("rank 1 did not receive rank 0's message into buf (hint: dist.recv fills the "
                             "tensor you pass it; src is the sender's rank)")
    if not all(out[0]):
        raise AssertionError("rank 0 did not get its message back (hint: rank 1 must send back what it "
                             "received, after receiving it)")
    sizes = ", ".join(f"{n} B" for n in SIZES)
    return f"correct: messages of {sizes} went to rank 1 and came back unchanged"
