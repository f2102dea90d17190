"""Prefetch for FSDP by hand: issue the next unit's all-gather before the current unit computes.

    torchrun --standalone --nproc-per-node=4 -m source_code.sharding.own_fsdp_report   # measures it

Without prefetch (own_fsdp.Unit) a unit's forward pre-hook issues its all-gather and waits for
it: the rank computes nothing while the bytes travel. With prefetch, unit i's pre-hook waits
for its own gather (issued earlier), then **issues** unit i+1's without waiting, and unit i
computes while those bytes travel; in backward the units come in reverse order, so unit i's
backward hook issues unit i-1's. Two units are full at once: the one computing and the one
arriving. Whether the transfer really runs under the computation depends on who moves the
bytes: NCCL on its own CUDA stream, gloo on its worker thread (async_op=True).

    unit i     [wait i] [issue i+1] [compute i ...........]
    transfer            [ gather i+1 ~~~~~~~~ ]
    unit i+1                                   [wait i+1: done] [issue i+2] [compute i+1 ...]
"""
from __future__ import annotations

import torch.distributed as dist

from source_code.sharding.own_fsdp import Unit, alloc_storage, shard_by_hand


class PrefetchUnit(Unit):
    """A Unit whose all-gather can be issued early (``issue``) and waited for later (``gather``)."""

    next_forward: Unit | None = None    # the unit whose gather this one issues in forward
    next_backward: Unit | None = None   # ... and in backward (the previous unit in forward order)
    pending = None                      # the in-flight all-gather (a Work), if issued

    def issue(self) -> None:
        """Start the all-gather of this unit's full parameters; do not wait for it."""
        if self.pending is None:
            alloc_storage(self.full)
            self.pending = dist.all_gather_into_tensor(self.full.data, self.shard.detach(),
                                                       async_op=True)

    def gather(self) -> None:
        """Wait for this unit's all-gather (issued now if nobody prefetched it)."""
        self.issue()
        self.pending.wait()
        self.pending = None

    def unshard(self) -> None:
        super().unshard()                    # my parameters: gathered (waited for) and in place
        if self.next_forward is not None:
            self.next_forward.issue()        # travels while this unit computes

    def before_backward(self) -> None:
        self.gather()
        if self.next_backward is not None:
            self.next_backward.issue()       # backward runs the units in reverse order


def shard_with_prefetch(model, units=None, prefetch: bool = True) -> list[PrefetchUnit]:
    """shard_by_hand with PrefetchUnits chained in forward order (reversed for backward, from the
    head down to the first block);
    ``prefetch=False``: the same units, nothing issued ahead (each gathers when it starts)."""
    made = shard_by_hand(model, units, unit_class=PrefetchUnit)
    if prefetch:
        for i, (earlier, later) in enumerate(zip(made, made[1:])):
            earlier.next_forward = later
            if i >= 2:      # tok and pos: autograd picks which of the two comes first in backward,
                later.next_backward = earlier    # so the chain starts at the first block
    return made
