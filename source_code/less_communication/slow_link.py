"""``SlowLink``: every collective counted, charged the time of a chosen link, optionally slept.

    with SlowLink(world_size, "inter-site", sleep=True) as wire:
        ...                                    # train: DDP's hooks, our all-reduces alike
    wire.simulated_s, wire.measured_s, wire.payload, wire.wire

It is ``measure.CommCounter`` (a dispatch mode that sees every c10d collective, DDP's
included) plus a link: each collective's time on that link comes from the alpha-beta model
(``links.collective_seconds``), is added to ``simulated_s`` and, with ``sleep``, slept right
after the collective has completed, so a CPU run on a fast local link takes as long as it would on
the slow one. ``measured_s`` is the time the collectives really took here, so that
``elapsed - measured_s + simulated_s`` is a run's time on the chosen link without sleeping.
``step()`` closes a step and keeps its ops (kind, payload bytes) for replaying the same run on
other links (``replay``).
"""
from __future__ import annotations

import time

from source_code.less_communication import links
from source_code.measure import CommCounter


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

    def step(self) -> list:
        """Close a step: the ops issued since the last call."""
        ops = self.ops[self._mark:]
        self._mark = len(self.ops)
        self.steps.append(ops)
        return ops


def replay(ops, link, world: int) -> float:
    """Seconds that a list of (kind, payload bytes) takes on ``link``."""
    return sum(links.collective_seconds(kind, nbytes, link, world) for kind, nbytes in ops)
