"""The ring of context parallelism: each rank sends a buffer to the next rank and receives one
from the previous rank, in the background, while it computes.

    pending = ring.exchange(kv, "kv", "forward", step)   # post: isend to next, irecv from prev
    ... compute with the block we already hold ...
    kv = pending.wait()                                  # the previous rank's block is here

On gloo (CPU) the two directions are a plain ``dist.isend`` and ``dist.irecv`` (torch 2.6's
gloo cannot be trusted with ``batch_isend_irecv``, see torch_versions "pipelining"); on CUDA
tensors (NCCL) they go in one ``batch_isend_irecv``, because NCCL runs a lone send and a lone
recv one after the other on the same stream, and two ranks that both send first would wait
for each other. Tags keep two exchanges in flight apart on gloo (K/V and dK/dV in backward).

Every exchange is recorded: bytes sent (``ledger``) and when it was posted and when its wait
returned (``events``, seconds of ``time.perf_counter``, one clock for all processes of a
machine), so a run can be drawn as a Gantt chart and its communication counted.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

TAGS = {"kv": 11, "dkv": 12}


@dataclass
class Pending:
    """One exchange in flight; ``wait()`` returns the received buffer (again on a second call)."""
    requests: list
    received: torch.Tensor
    sent: torch.Tensor        # kept alive until the send completed
    event: dict

    def wait(self) -> torch.Tensor:
        if self.requests:
            for req in self.requests:
                req.wait()
            self.requests = []
            self.event["done"] = time.perf_counter()
        return self.received


@dataclass
class Ring:
    """Neighbours of this rank in ``group`` (None: the whole job) and the record of its traffic."""
    group: object = None
    rank: int = field(init=False)
    world: int = field(init=False)
    events: list = field(default_factory=list)      # exchanges: what, phase, step, bytes, post, done
    computes: list = field(default_factory=list)    # compute spans: phase, step, start, end, pairs

    def __post_init__(self):
        self.rank = dist.get_rank(self.group)
        self.world = dist.get_world_size(self.group)

    def _global(self, r: int) -> int:
        return r if self.group is None else dist.get_global_rank(self.group, r)

    @property
    def next(self) -> int:
        return self._global((self.rank + 1) % self.world)

    @property
    def prev(self) -> int:
        return self._global((self.rank - 1) % self.world)

    def exchange(self, t: torch.Tensor, what: str, phase: str, step: int) -> Pending:
        """Send ``t`` to the next rank, receive a tensor of its shape from the previous one."""
        t = t.contiguous()
        buf = torch.empty_like(t)
        event = {"what": what, "phase": phase, "step": step, "bytes": t.numel() * t.element_size(),
                 "post": time.perf_counter(), "done": None}
        if t.is_cuda:
            ops = [dist.P2POp(dist.isend, t, self.next, self.group),
                   dist.P2POp(dist.irecv, buf, self.prev, self.group)]
            reqs = dist.batch_isend_irecv(ops)
        else:
            reqs = [dist.isend(t, self.next, self.group, tag=TAGS[what]),
                    dist.irecv(buf, self.prev, self.group, tag=TAGS[what])]
        self.events.append(event)
        return Pending(reqs, buf, t, event)

    def bytes_sent(self, phase: str | None = None, what: str | None = None) -> int:
        return sum(e["bytes"] for e in self.events
                   if (phase is None or e["phase"] == phase) and (what is None or e["what"] == what))

    def pairs(self, phase: str) -> int:
        """Query-key pairs this rank scored in ``phase``."""
        return sum(c["pairs"] for c in self.computes if c["phase"] == phase)

    def reset(self) -> None:
        self.events.clear()
        self.computes.clear()
