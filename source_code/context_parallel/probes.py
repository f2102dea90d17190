"""Measuring ring attention from the outside: a ``Ring`` that records every transfer and a
kernel wrapper that times and counts every block attention. The lesson code (ring.py,
comm.py, partial.py) stays free of timers and counters; the harness passes these in::

    probe = Probe(device)
    out = ring_attention(q, k, v, ring=probe.ring, kernel=probe.kernel)    # phase "forward"
    probe.phase = "backward"
    out.backward(dout)
    probe.exchanges    # what, phase, step, bytes, post, done    (one per exchange)
    probe.calls        # phase, step, start, end, computed, unmasked   (one per block attention)

Times are ``measure.clock(device)`` (perf_counter after the device's queued work: CUDA is
synchronised), one clock for every process of a machine, so ranks can be drawn on one axis.
``step`` of a compute call is the ring step: the number of K/V blocks received so far in the
phase. ``computed`` is the score entries the kernel computed per (batch, head), ``unmasked``
those the mask left visible, counted from the scores themselves (``count=True``; it computes
the scores a second time, so timing runs leave it off).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from source_code.context_parallel import partial
from source_code.context_parallel.comm import Pending, Ring
from source_code.measure import clock


@dataclass
class MeasuredPending(Pending):
    event: dict = None
    probe: "Probe" = None

    def wait(self) -> torch.Tensor:
        if self.requests:
            super().wait()
            self.event["done"] = clock(self.probe.device)
            if self.event["what"] == "kv":
                self.probe.received[self.event["phase"]] += 1
        return self.received


class MeasuredRing(Ring):
    """A ``Ring`` whose exchanges are recorded in ``probe.exchanges``."""

    def __init__(self, probe: "Probe", group=None):
        super().__init__(group)
        self.probe = probe

    def exchange(self, t: torch.Tensor, what: str) -> Pending:
        p = self.probe
        step = sum(1 for e in p.exchanges if (e["what"], e["phase"]) == (what, p.phase))
        event = {"what": what, "phase": p.phase, "step": step, "bytes": t.numel() * t.element_size(),
                 "post": clock(p.device), "done": None}
        p.exchanges.append(event)
        pending = super().exchange(t, what)
        return MeasuredPending(pending.requests, pending.received, pending.sent, event, p)


class MeasuredKernel:
    """partial.attend / attend_backward, each call timed (and counted with ``count``)."""

    def __init__(self, probe: "Probe", count: bool):
        self.probe, self.count = probe, count

    def _record(self, fn, q, k, scale, diagonal, *args):
        p = self.probe
        call = {"phase": p.phase, "step": p.received[p.phase], "start": clock(p.device),
                "computed": q.shape[-2] * k.shape[-2], "diagonal": diagonal}
        result = fn(*args)
        call["end"] = clock(p.device)
        if self.count:  # the entries the mask left: finite scores of the first (batch, head)
            call["unmasked"] = int(torch.isfinite(partial.scores(q, k, scale, diagonal)[0, 0]).sum())
        p.calls.append(call)
        return result

    def attend(self, q, k, v, scale, diagonal):
        return self._record(partial.attend, q, k, scale, diagonal, q, k, v, scale, diagonal)

    def attend_backward(self, q, k, v, out, lse, dout, scale, diagonal):
        return self._record(partial.attend_backward, q, k, scale, diagonal,
                            q, k, v, out, lse, dout, scale, diagonal)


class Probe:
    """One ring attention's record: its transfers, its block attentions, the phase now."""

    def __init__(self, device, group=None, count: bool = False):
        self.device = torch.device(device)
        self.phase = "forward"
        self.exchanges: list[dict] = []
        self.calls: list[dict] = []
        self.received = {"forward": 0, "backward": 0}
        self.ring = MeasuredRing(self, group)
        self.kernel = MeasuredKernel(self, count)

    def bytes_sent(self, phase: str | None = None, what: str | None = None) -> int:
        return sum(e["bytes"] for e in self.exchanges
                   if (phase is None or e["phase"] == phase) and (what is None or e["what"] == what))

    def entries(self, phase: str, key: str = "unmasked") -> int:
        """Score entries per (batch, head) the kernel saw in ``phase``: ``unmasked`` or ``computed``."""
        return sum(c[key] for c in self.calls if c["phase"] == phase)

    def spans(self) -> list[dict]:
        """Compute spans, one per (phase, ring step): first block's start to last block's end."""
        out = {}
        for c in self.calls:
            s = out.setdefault((c["phase"], c["step"]), {"phase": c["phase"], "step": c["step"],
                                                         "start": c["start"], "end": c["end"]})
            s["start"], s["end"] = min(s["start"], c["start"]), max(s["end"], c["end"])
        return list(out.values())

    def compute_s(self) -> float:
        """Seconds inside the block attention kernel, both phases."""
        return sum(c["end"] - c["start"] for c in self.calls)
