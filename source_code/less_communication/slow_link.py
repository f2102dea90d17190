"""``SlowLink``: every collective counted, charged the time of a chosen link, optionally slept.

    with SlowLink(world_size, "inter-site", sleep=True) as wire:
        ...                                    # train: DDP's hooks, our all-reduces alike
    wire.simulated_s, wire.measured_s, wire.payload, wire.wire

    wire.counted(hook)                         # a DDP hook whose collectives it counts

It is ``measure.CommCounter`` (a dispatch mode that sees every c10d collective, DDP's
included) plus a link: each collective's time on that link comes from the alpha-beta model
(``links.collective_seconds``), is added to ``simulated_s`` and, with ``sleep``, slept right
after the collective has completed, so a CPU run on a fast local link takes as long as it would on
the slow one. ``measured_s`` is the time the collectives really took here, so that
``elapsed - measured_s + simulated_s`` is a run's time on the chosen link without sleeping.
``step()`` closes a step and keeps its ops (kind, payload bytes) for replaying the same run on
other links (``replay``). ``LinkInFlight`` does the same for an asynchronous all-reduce: the
link's time is waited out in its ``wait``, so compute issued meanwhile hides it.
"""
from __future__ import annotations

import time

import torch.distributed as dist

from source_code.less_communication import links
from source_code.measure import CommCounter, clock


class SlowLink(CommCounter):
    def __init__(self, world_size: int, link="inter-site", sleep: bool = False):
        super().__init__(world_size)
        self.link = links.link(link) if isinstance(link, str) else link
        self.sleep = sleep
        self.simulated_s = 0.0
        self.measured_s = 0.0
        self.steps = []          # per closed step: [(kind, payload bytes), ...]
        self._mark = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        counted = len(self.ops)
        start = time.perf_counter()
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if len(self.ops) == counted:             # not a collective
            return out
        self.measured_s += time.perf_counter() - start
        kind, nbytes = self.ops[-1]
        delay = links.collective_seconds(kind, nbytes, self.link, self.n)
        self.simulated_s += delay
        if self.sleep:
            for item in out if isinstance(out, (tuple, list)) else (out,):
                if hasattr(item, "wait"):      # the collective's Work: done on every rank first,
                    item.wait()                # so no rank computes while another one sleeps
            time.sleep(delay)
        return out

    def counted(self, hook):
        """A DDP communication hook whose collectives this mode counts (it is entered for the
        hook's call only: the rest of the step runs without the mode's per-operator cost)."""
        def counted_hook(state, bucket):       # DDP looks for a parameter named bucket
            with self:
                return hook(state, bucket)
        return counted_hook

    def step(self) -> list:
        """Close a step: the ops issued since the last call."""
        ops = self.ops[self._mark:]
        self._mark = len(self.ops)
        self.steps.append(ops)
        return ops


def replay(ops, link, world: int) -> float:
    """Seconds that a list of (kind, payload bytes) takes on ``link``."""
    return sum(links.collective_seconds(kind, nbytes, link, world) for kind, nbytes in ops)


class LinkInFlight:
    """``send`` for ``StreamingDiLoCo(delay=...)``: an asynchronous all-reduce that behaves as
    if it crossed ``link``. It is started at once (``async_op=True``); its ``wait`` returns no
    earlier than the link model's time after the start, sleeping what is left of it. So the
    compute done while it was in flight hides that much of the link. Per all-reduce ``sends``
    keeps: ``modelled`` (the link's time: what a synchronous wait would cost), ``uncovered``
    (the part of it still ahead when ``wait`` was called: not hidden by the compute in
    between), ``exposed`` (the time the worker really stood in ``wait``: that part, plus the
    all-reduce itself and any wait for a rank that reached it later: on a loaded machine, much
    more) and ``closing`` (waited while ``closing`` was set: at the end of training, at once).
    ``link`` may be changed between sends (the harness sets it from the steps measured so far)."""

    def __init__(self, world_size: int, link="inter-site", device=None):
        self.link = links.link(link) if isinstance(link, str) else link
        self.n, self.device = world_size, device
        self.sends = []
        self.closing = False

    def __call__(self, flat):
        seconds = links.collective_seconds("all_reduce", flat.numel() * flat.element_size(), self.link, self.n)
        record = {"modelled": seconds, "uncovered": 0.0, "exposed": 0.0, "closing": False}
        self.sends.append(record)
        return _InFlight(dist.all_reduce(flat, async_op=True), clock(self.device) + seconds, self, record)


class _InFlight:
    def __init__(self, work, ready_at: float, owner: LinkInFlight, record: dict):
        self.work, self.ready_at, self.owner, self.record = work, ready_at, owner, record

    def wait(self):
        start = clock(self.owner.device)
        self.record["uncovered"] = max(0.0, self.ready_at - start)
        self.record["closing"] = self.owner.closing
        self.work.wait()
        left = self.ready_at - clock(self.owner.device)
        if left > 0:
            time.sleep(left)
        self.record["exposed"] = clock(self.owner.device) - start
        return True
