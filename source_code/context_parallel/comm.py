"""The ring of context parallelism: each rank sends a buffer to the next rank and receives one
from the previous rank, in the background, while it computes.

    pending = ring.exchange(kv, "kv")    # post: isend to next, irecv from prev
    ... compute with the block we already hold ...
    kv = pending.wait()                  # the previous rank's block is here

On gloo (CPU) the two directions are a plain ``dist.isend`` and ``dist.irecv`` (torch 2.6's
gloo cannot be trusted with ``batch_isend_irecv``, see torch_versions "pipelining"); on CUDA
tensors (NCCL) they go in one ``batch_isend_irecv``, because NCCL runs a lone send and a lone
recv one after the other on the same stream, and two ranks that both send first would wait
for each other. Tags keep two exchanges in flight apart on gloo (K/V and dK/dV in backward).

Nothing here measures: the harness records bytes and times with a subclass of ``Ring``
(probes.MeasuredRing) that wraps ``exchange``.
"""
from __future__ import annotations

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

    def wait(self) -> torch.Tensor:
        for req in self.requests:
            req.wait()
        self.requests = []
        return self.received


@dataclass
class Ring:
    """Neighbours of this rank in ``group`` (None: the whole job)."""
    group: object = None
    rank: int = field(init=False)
    world: int = field(init=False)

    def __post_init__(self):
        self.rank = dist.get_rank(self.group)
        self.world = dist.get_world_size(self.group)

    def global_rank(self, r: int) -> int:
        return r if self.group is None else dist.get_global_rank(self.group, r)

    @property
    def next(self) -> int:
        return self.global_rank((self.rank + 1) % self.world)

    @property
    def prev(self) -> int:
        return self.global_rank((self.rank - 1) % self.world)

    def exchange(self, t: torch.Tensor, what: str) -> Pending:
        """Send ``t`` to the next rank, receive a tensor of its shape from the previous one."""
        t = t.contiguous()
        buf = torch.empty_like(t)
        if t.is_cuda:
            ops = [dist.P2POp(dist.isend, t, self.next, self.group),
                   dist.P2POp(dist.irecv, buf, self.prev, self.group)]
            reqs = dist.batch_isend_irecv(ops)
        else:
            reqs = [dist.isend(t, self.next, self.group, tag=TAGS[what]),
                    dist.irecv(buf, self.prev, self.group, tag=TAGS[what])]
        return Pending(reqs, buf, t)
