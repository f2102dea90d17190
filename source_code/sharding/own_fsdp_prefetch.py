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


def backward_chain(names: list[str]) -> dict:
    """{unit: the unit whose gather it issues in backward}: each unit the one before it, from the
    last down to the first block; the two embeddings gather on demand (autograd picks which of
    them comes first in backward)."""
    return {later: earlier for earlier, later in zip(names[2:], names[3:])}


def shard_with_prefetch(model, units=None, prefetch: bool = True, unit_class=PrefetchUnit,
                        limit: int | None = 1) -> list[PrefetchUnit]:
    """shard_by_hand with PrefetchUnits chained in forward order, and in backward by
    ``backward_chain``; ``prefetch=False``: the same units, nothing issued ahead (each gathers
    when it starts). ``unit_class``: a subclass of PrefetchUnit; ``limit``: as shard_by_hand's."""
    made = shard_by_hand(model, units, unit_class=unit_class, limit=limit)
    if prefetch:
        by_name = {u.name: u for u in made}
        for earlier, later in zip(made, made[1:]):
            earlier.next_forward = later
        for later, earlier in backward_chain([u.name for u in made]).items():
            by_name[later].next_backward = by_name[earlier]
    return made
