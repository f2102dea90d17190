"""Point-to-point messages between neighbouring pipeline stages.

Stage s sends activations to s+1 and gradients to s-1; it receives activations from s-1 and
gradients from s+1. One call, ``StageLink.exchange(send, recv)``, posts the message this
operation produced together with the one the next operation needs, in ONE
``dist.batch_isend_irecv``:

* on NCCL, two stages that send to each other at the same moment (1F1B's steady state: an
  activation goes down while a gradient comes up) must post both directions together, or
  each blocks in its send waiting for the other's receive;
* on gloo the same code works; a send never blocks the sender (it is waited for at the end
  of the step, in ``flush``), so a stage only ever waits for what it receives.

``dist.batch_isend_irecv`` returns one Work per operation on gloo but ONE Work for the whole
batch on NCCL: we wait on every Work that may cover a receive before using the received data.
Messages between two stages are matched in the order they are posted (activations in
microbatch order one way, gradients the other), which the schedules respect.

On CPU (gloo) a message moves on a helper thread of each process; with one core per stage
that thread gets the core only when the stage stops computing. So on gloo (``early_receives``)
a stage posts the receive of its NEXT operation before computing the current one
(``post_receive``, then ``wait``): the message lands while it computes, instead of starting
only when it asks. NCCL keeps the paired ``exchange``: there a receive posted alone before a
send to the same peer can block both GPUs' streams.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


class StageLink:
    """The messages of pipeline stage ``stage`` of ``n_stages`` (one stage per rank of ``ranks``)."""

    def __init__(self, stage: int, n_stages: int, device: torch.device, ranks=None, group=None):
        self.stage, self.n_stages, self.device, self.group = stage, n_stages, device, group
        self.ranks = list(ranks) if ranks is not None else list(range(n_stages))
        self.prev = self.ranks[stage - 1] if stage > 0 else None
        self.next = self.ranks[stage + 1] if stage < n_stages - 1 else None
        self._pending: list = []        # (Work, tensor): sends not yet known to be complete
        self.messages = 0               # how many tensors this stage sent (for reports)
        self.early_receives = torch.device(device).type == "cpu"   # see the module docstring

    def exchange(self, send=None, recv=None):
        """Post ``send`` = (tensor, "next" | "prev") and the receive ``recv`` = (shape, dtype,
        "next" | "prev") together; return the received tensor (or None)."""
        ops, sent = [], None
        if send is not None:
            tensor, where = send
            sent = tensor.contiguous()
            ops.append(dist.P2POp(dist.isend, sent, self._peer(where), self.group))
            self.messages += 1
        buf = None
        if recv is not None:
            shape, dtype, where = recv
            buf = torch.empty(shape, dtype=dtype, device=self.device)
            ops.append(dist.P2POp(dist.irecv, buf, self._peer(where), self.group))
        if not ops:
            return None
        works = dist.batch_isend_irecv(ops)
        if len(works) == len(ops) and sent is not None:   # gloo: one Work per op
            self._pending.append((works[0], sent))        # the send finishes in the background
            works = works[1:]
        elif buf is None:                                  # a lone send (any backend)
            self._pending.extend((w, sent) for w in works)
            works = []
        for w in works:                                    # NCCL: the one Work covers both
            w.wait()
        return buf

    def post_receive(self, recv):
        """Post the receive ``recv`` = (shape, dtype, "next" | "prev") now; ``wait`` returns the tensor."""
        shape, dtype, where = recv
        buf = torch.empty(shape, dtype=dtype, device=self.device)
        return buf, dist.batch_isend_irecv([dist.P2POp(dist.irecv, buf, self._peer(where), self.group)])

    @staticmethod
    def wait(posted) -> torch.Tensor:
        buf, works = posted
        for w in works:
            w.wait()
        return buf

    def flush(self) -> None:
        """Wait for every send still in flight (end of a step: buffers may be reused after)."""
        for work, _ in self._pending:
            work.wait()
        self._pending.clear()

    def _peer(self, where: str) -> int:
        peer = self.next if where == "next" else self.prev if where == "prev" else "?"
        if peer is None or peer == "?":
            raise ValueError(f"stage {self.stage} of {self.n_stages} has no {where!r} neighbour")
        return peer
