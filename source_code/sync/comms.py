"""All-reduce four ways on torch.distributed: parameter server, naive ring, ring, and the library.

Every function reduces ``tensor`` in place over ``group`` (sum or average) and returns it; the
same code runs on gloo + CPU tensors and on NCCL + GPU tensors. What each one moves is counted
in ``source_code/costmodel.py`` (``traffic``).

* ``ps_all_reduce``: every rank sends its buffer to one rank (the server), which sums and
  sends the result back: 2 messages in a row, (N-1) x M through the server's link each way.
* ``naive_ring_all_reduce``: the whole buffer goes round the ring N-1 times.
* ``ring_all_reduce``: the buffer is cut into N chunks; N-1 reduce-scatter steps leave each
  rank with one fully summed chunk, N-1 all-gather steps hand the summed chunks round. Each
  rank sends 2 (N-1)/N x M whatever N is: the bandwidth-optimal algorithm.
* ``library_all_reduce``: ``dist.all_reduce``, the reference the others are checked against.

Point-to-point messages go through ``dist.batch_isend_irecv``: a blocking send() to the right
then recv() from the left deadlocks (every rank waits in send). The batch returns its Works
differently per backend (NCCL: one Work for the batch, gloo: one per operation), so the code
waits on *every* Work of a batch before it reads what the batch received.

    python -m source_code.sync.harness        # checks all four against each other on 3 processes
"""
from __future__ import annotations

import torch
import torch.distributed as dist

OPS = ("sum", "avg")
SEGMENT_BYTES = 2**20  # reduce-scatter messages travel in pieces of at most this many bytes


def check_input(tensor: torch.Tensor, op: str) -> None:
    """The conditions every implementation here needs; a clear error otherwise."""
    if op not in OPS:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    if not tensor.is_contiguous():
        raise ValueError("the tensor must be contiguous (the ring works on a flat view): "
                         "pass tensor.contiguous() and copy the result back")
    if op == "avg" and not tensor.is_floating_point():
        raise ValueError(f"op='avg' needs a floating-point tensor, got {tensor.dtype}")


def group_ranks(group=None) -> list[int]:
    """The global ranks of ``group`` in order (the ring goes round them in this order)."""
    return dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))


def wait_all(works) -> None:
    """Wait on every Work of a batch: one with NCCL, one per send/receive with gloo."""
    for work in works:
        work.wait()


class RingNeighbours:
    """This rank's two neighbours on the ring: it sends to ``right`` and receives from ``left``."""

    def __init__(self, right: int, left: int, group=None):
        self.right, self.left, self.group = right, left, group

    def post(self, send: torch.Tensor | None, recv: torch.Tensor | None) -> list:
        """Start sending ``send`` to the right and receiving into ``recv`` from the left, as one
        batch; return its Works. ``recv`` may be read only after every Work has been waited on.
        None or an empty tensor: nothing to send / receive (both ends know the lengths)."""
        ops = []
        if send is not None and send.numel() > 0:
            ops.append(dist.P2POp(dist.isend, send, self.right, self.group))
        if recv is not None and recv.numel() > 0:
            ops.append(dist.P2POp(dist.irecv, recv, self.left, self.group))
        return dist.batch_isend_irecv(ops) if ops else []

    def exchange(self, send: torch.Tensor, recv: torch.Tensor) -> None:
        """Send to the right, receive from the left into ``recv``; return when both are done."""
        wait_all(self.post(send, recv))


def ps_all_reduce(tensor: torch.Tensor, op: str = "sum", group=None, root: int = 0):
    """All-reduce through one rank (the server, ``root``-th of the group): gather, sum, send back."""
    check_input(tensor, op)
    ranks = group_ranks(group)
    server, me = ranks[root], dist.get_rank()
    others = [r for r in ranks if r != server]
    if not others:
        return tensor
    if me == server:
        inbox = [torch.empty_like(tensor) for _ in others]  # N-1 buffers like ours
        wait_all(dist.batch_isend_irecv([dist.P2POp(dist.irecv, buf, r, group) for buf, r in zip(inbox, others)]))
        for buf in inbox:
            tensor.add_(buf)
        if op == "avg":
            tensor.div_(len(ranks))
        wait_all(dist.batch_isend_irecv([dist.P2POp(dist.isend, tensor, r, group) for r in others]))
    else:
        wait_all(dist.batch_isend_irecv([dist.P2POp(dist.isend, tensor, server, group)]))
        wait_all(dist.batch_isend_irecv([dist.P2POp(dist.irecv, tensor, server, group)]))
    return tensor


def naive_ring_all_reduce(tensor: torch.Tensor, op: str = "sum", group=None):
    """Pass whole buffers round the ring N-1 times: step s forwards the buffer received in step
    s-1 (first our own) and adds the incoming one. Correct, but (N-1) x M per rank."""
    check_input(tensor, op)
    ranks = group_ranks(group)
    world, me = len(ranks), ranks.index(dist.get_rank())
    if world == 1:
        return tensor
    ring = RingNeighbours(ranks[(me + 1) % world], ranks[(me - 1) % world], group)
    flat = tensor.view(-1)                                      # [n]
    outgoing, incoming = flat.clone(), torch.empty_like(flat)  # [n] each
    for _ in range(world - 1):
        ring.exchange(outgoing, incoming)
        flat.add_(incoming)
        outgoing, incoming = incoming, outgoing
    if op == "avg":
        flat.div_(world)
    return tensor


def reduce_scatter_phase(chunks, rank: int, world: int, ring: RingNeighbours,
                         segment_bytes: int = SEGMENT_BYTES) -> None:
    """N-1 steps: send chunk (rank - s) to the right, add the incoming chunk (rank - s - 1) into ours.

    Afterwards chunk (rank + 1) mod N holds the sum over all ranks. A chunk travels in segments
    of ``segment_bytes`` (the same on every rank): all segments are posted at once and added in
    order, so adding segment i overlaps the transfer of the segments after it. Sender and
    receiver cut a message into the same segments, because both cut the same chunk."""
    scratch = torch.empty_like(chunks[0])  # [len(chunk 0)]: chunk 0 is the longest, room for any
    per_segment = max(1, segment_bytes // chunks[0].element_size())  # elements per segment
    for s in range(world - 1):
        send = chunks[(rank - s) % world]        # [L_send]: the right neighbour adds it to its copy
        target = chunks[(rank - s - 1) % world]  # [L_recv]: the left neighbour sends us its copy
        incoming = scratch[: target.numel()]     # [L_recv]
        send_parts = send.split(per_segment)
        recv_parts = incoming.split(per_segment)
        target_parts = target.split(per_segment)  # the same cut as recv_parts
        # L_send and L_recv may differ by one element, and so by one segment
        batches = []
        for i in range(max(len(send_parts), len(recv_parts))):
            out = send_parts[i] if i < len(send_parts) else None
            into = recv_parts[i] if i < len(recv_parts) else None
            batches.append(ring.post(out, into))
        for i, works in enumerate(batches):
            wait_all(works)                       # every Work of batch i: segment i has arrived
            if i < len(recv_parts):
                target_parts[i].add_(recv_parts[i])


def all_gather_phase(chunks, rank: int, world: int, exchange) -> None:
    """N-1 steps: forward chunk (rank + 1 - s), the one completed most recently; overwrite the
    incoming chunk (rank - s) with the left neighbour's complete copy.

    ``exchange(send, recv)`` sends to the right neighbour and receives from the left one
    (``RingNeighbours.exchange``; notebook 02's exercise writes this function)."""
    for s in range(world - 1):
        exchange(chunks[(rank + 1 - s) % world], chunks[(rank - s) % world])


def ring_all_reduce(tensor: torch.Tensor, op: str = "sum", group=None, all_gather=all_gather_phase,
                    segment_bytes: int = SEGMENT_BYTES):
    """Chunked ring all-reduce of ``tensor`` (any shape and size): reduce-scatter, then all-gather."""
    check_input(tensor, op)
    if segment_bytes < 1:
        raise ValueError(f"segment_bytes must be at least 1, got {segment_bytes}")
    ranks = group_ranks(group)
    world, me = len(ranks), ranks.index(dist.get_rank())
    if world == 1:
        return tensor
    ring = RingNeighbours(ranks[(me + 1) % world], ranks[(me - 1) % world], group)
    chunks = list(tensor.view(-1).tensor_split(world))  # N views of [n // N or n // N + 1]: in place
    reduce_scatter_phase(chunks, me, world, ring, segment_bytes)
    if op == "avg":  # divide the one chunk we own, once, before handing it round
        chunks[(me + 1) % world].div_(world)
    all_gather(chunks, me, world, ring.exchange)
    return tensor


def library_all_reduce(tensor: torch.Tensor, op: str = "sum", group=None):
    """dist.all_reduce with the same signature as the others."""
    check_input(tensor, op)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
    if op == "avg":  # SUM then divide: ReduceOp.AVG exists only on some backends
        tensor.div_(dist.get_world_size(group))
    return tensor


IMPLEMENTATIONS = {"ring": ring_all_reduce, "naive_ring": naive_ring_all_reduce,
                   "parameter_server": ps_all_reduce, "library": library_all_reduce}
