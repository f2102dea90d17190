"""Ring all-reduce built from point-to-point messages on torch.distributed, and the naive ring.

* ``ring_all_reduce``: the buffer is cut into N chunks; N-1 reduce-scatter steps leave each rank
  with one fully summed chunk, N-1 all-gather steps hand the summed chunks round. Each rank
  sends 2 (N-1)/N of the buffer, whatever N is: the bandwidth-optimal algorithm. Large chunks
  travel in 1 MiB segments so that adding one segment overlaps with receiving the next.
* ``naive_ring_all_reduce``: the whole buffer goes round the ring N-1 times: (N-1) x the buffer
  per rank.
* ``check_all_gather``: the check of notebook 02's exercise (write the all-gather half).

Sends and receives go through ``dist.batch_isend_irecv`` (in ``RingLinks.start``): a blocking
send() to the right then recv() from the left deadlocks (every rank waits in send), and on NCCL
the batched call also sets up the neighbour connections without a cycle of waits. The batch
returns its Works differently per backend: NCCL one Work for the whole batch, gloo one per
operation. So the code waits on every Work of a batch (``wait_all``) before it reads what the
batch received, and never assumes one Work per operation. gloo + CPU here, NCCL + GPU on a GPU
node: the same code.

    python -m source_code.sync.ring_allreduce      # checks both against dist.all_reduce on 3 processes
"""
from __future__ import annotations

import queue
import threading
from functools import partial
from itertools import zip_longest

import torch
import torch.distributed as dist

OPS = ("sum", "avg")
SEGMENT_BYTES = 2**20  # reduce-scatter messages travel in pieces of at most this many bytes


def _peers(group):
    """(my index in the group, group size, list of global ranks in ring order)."""
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
    return dist.get_rank(group), len(ranks), ranks


def wait_all(works) -> None:
    """Wait for every Work of a batch: one with NCCL, one per send/receive with gloo."""
    for work in works:
        work.wait()


class RingLinks:
    """This rank's two links on the ring: it sends to its right neighbour, receives from its left.

    ``ranks`` lists the global ranks in ring order (the group's ranks), ``rank`` is our index in it.
    """

    def __init__(self, rank: int, world: int, ranks=None, group=None):
        ranks = ranks or list(range(world))
        self.right = ranks[(rank + 1) % world]
        self.left = ranks[(rank - 1) % world]
        self.group = group

    def start(self, send: torch.Tensor | None, recv: torch.Tensor | None) -> list:
        """Post the send of ``send`` and the receive into ``recv`` as one batch; return its Works.

        Either may be None or empty: nothing to send, or nothing to receive, in this batch (chunk
        lengths are known on both ends, so both ends skip the same empty messages). ``recv`` may
        only be read after ``wait_all`` on the returned Works."""
        ops = []
        if send is not None and send.numel() > 0:
            ops.append(dist.P2POp(dist.isend, send, self.right, self.group))
        if recv is not None and recv.numel() > 0:
            ops.append(dist.P2POp(dist.irecv, recv, self.left, self.group))
        if not ops:
            return []
        return dist.batch_isend_irecv(ops)

    def exchange(self, send: torch.Tensor, recv: torch.Tensor) -> None:
        """Send ``send`` to the right neighbour, receive from the left one into ``recv``; return when both are done."""
        wait_all(self.start(send, recv))


def _check_input(tensor: torch.Tensor, op: str) -> None:
    if op not in OPS:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    if not tensor.is_contiguous():
        raise ValueError("the tensor must be contiguous (the ring works on a flat view): "
                         "pass tensor.contiguous() and copy the result back")
    if op == "avg" and not tensor.is_floating_point():
        raise ValueError(f"op='avg' needs a floating-point tensor, got {tensor.dtype}")


def reduce_scatter_phase(chunks, rank: int, world: int, links: RingLinks,
                         segment_bytes: int = SEGMENT_BYTES) -> None:
    """N-1 steps: send chunk (rank - s) to the right, add the incoming chunk (rank - s - 1) into ours.

    Afterwards chunk (rank + 1) mod N holds the sum over all ranks. ``segment_bytes`` must be the
    same on every rank (as the tensor's size and dtype must be for any all-reduce)."""
    scratch = torch.empty_like(chunks[0])  # [len(chunk 0)]: chunk 0 is the longest, room for any chunk
    per_segment = max(1, segment_bytes // chunks[0].element_size())  # elements per segment
    for s in range(world - 1):
        send = chunks[(rank - s) % world]      # [L_send]: the right neighbour adds it into its copy
        recv = chunks[(rank - s - 1) % world]  # [L_recv]: the left neighbour sends us its copy
        send_and_add(links, send, recv, scratch[: recv.numel()], per_segment)


def send_and_add(links: RingLinks, send: torch.Tensor, target: torch.Tensor, incoming: torch.Tensor,
                 per_segment: int) -> None:
    """Send ``send`` to the right; receive the left neighbour's copy of ``target`` into ``incoming``
    and add it into ``target``.

    Each message travels in segments of ``per_segment`` elements, cut from its own length only.
    The sender and the receiver of a message both know that length (it is the same chunk on both
    sides), so they cut it into the same segments. Our send and our receive are different chunks,
    whose lengths may differ by one element, and so by one segment: batch i carries segment i of
    each message that has one. All batches are posted at once, then finished in order: adding
    segment i overlaps the transfer of the segments after it."""
    sends = send.split(per_segment)          # segments of [<= per_segment]
    receives = incoming.split(per_segment)   # segments of [<= per_segment]
    targets = target.split(per_segment)      # the same cut as receives
    batches = [links.start(out, into) for out, into in zip_longest(sends, receives)]  # None past the shorter
    for i, works in enumerate(batches):
        wait_all(works)                      # every Work of batch i: segment i has arrived
        if i < len(receives):
            targets[i].add_(receives[i])


def all_gather_phase(chunks, rank: int, world: int, exchange) -> None:
    """N-1 steps: forward chunk (rank + 1 - s), the one completed most recently; overwrite the
    incoming chunk (rank - s) with the neighbour's complete copy.

    ``exchange(send, recv)`` sends to the right neighbour and receives from the left one
    (``RingLinks.exchange``; notebook 02's exercise passes a stand-in with threads as ranks)."""
    for s in range(world - 1):
        exchange(chunks[(rank + 1 - s) % world], chunks[(rank - s) % world])


def ring_all_reduce(tensor: torch.Tensor, op: str = "sum", group=None, all_gather=all_gather_phase,
                    segment_bytes: int = SEGMENT_BYTES):
    """In-place chunked ring all-reduce of ``tensor`` (any shape and size) over ``group``; returns it.

    ``segment_bytes``: the size of the pieces reduce-scatter messages travel in (the same on every rank)."""
    _check_input(tensor, op)
    if segment_bytes < 1:
        raise ValueError(f"segment_bytes must be at least 1, got {segment_bytes}")
    rank, world, ranks = _peers(group)
    if world == 1:
        return tensor
    chunks = list(tensor.view(-1).tensor_split(world))  # N views of [n // N or n // N + 1]: in place
    links = RingLinks(rank, world, ranks, group)
    reduce_scatter_phase(chunks, rank, world, links, segment_bytes)
    if op == "avg":  # divide the one chunk we own, once, before handing it round
        chunks[(rank + 1) % world].div_(world)
    all_gather(chunks, rank, world, links.exchange)
    return tensor


def naive_ring_all_reduce(tensor: torch.Tensor, op: str = "sum", group=None):
    """In-place all-reduce that passes whole buffers round the ring N-1 times; returns ``tensor``.

    Step s: forward the buffer received in step s-1 (first our own), add the incoming one.
    Correct, but every rank sends (N-1) x the buffer instead of 2 (N-1)/N x."""
    _check_input(tensor, op)
    rank, world, ranks = _peers(group)
    if world == 1:
        return tensor
    links = RingLinks(rank, world, ranks, group)
    flat = tensor.view(-1)                                      # [n]
    outgoing, incoming = flat.clone(), torch.empty_like(flat)  # [n] each
    for _ in range(world - 1):
        links.exchange(outgoing, incoming)
        flat.add_(incoming)
        outgoing, incoming = incoming, outgoing
    if op == "avg":
        flat.div_(world)
    return tensor


def library_all_reduce(tensor: torch.Tensor, op: str = "sum", group=None):
    """dist.all_reduce with the same signature (the reference every implementation is checked against)."""
    _check_input(tensor, op)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
    if op == "avg":  # SUM then divide: ReduceOp.AVG exists only on some backends/versions
        tensor.div_(dist.get_world_size(group))
    return tensor


# --------------------------------------------------------------------------- checks
def compare_with_library(sizes=(1, 5, 1001, 4099), ops=OPS, seed: int = 0) -> dict:
    """Run on every rank of a group: max |ours - dist.all_reduce| per (implementation, size, op).

    Each rank draws different data (seed + rank). Sizes include ones smaller than and not
    divisible by the world size."""
    from source_code.sync.parameter_server import ps_all_reduce
    rank = dist.get_rank()
    from source_code.distributed import context
    device = context().device  # the device policy's choice for this process
    impls = {"ring": ring_all_reduce, "ring_small_segments": partial(ring_all_reduce, segment_bytes=64),
             "naive_ring": naive_ring_all_reduce, "parameter_server": ps_all_reduce}
    out = {}
    for size in sizes:
        x = torch.randn(size, generator=torch.Generator().manual_seed(seed + 1000 * rank + size),
                        dtype=torch.float64).to(device)
        for op in ops:
            expected = library_all_reduce(x.clone(), op)
            for name, fn in impls.items():
                got = fn(x.clone(), op)
                out[(name, size, op)] = float((got - expected).abs().max())
    return out


def check_all_gather(fn, world_sizes=(2, 3, 4), sizes=(12, 7, 3), timeout: float = 5.0) -> bool:
    """Check an all-gather phase ``fn(chunks, rank, world, exchange)`` with threads as ranks.

    Every "rank" starts from the state reduce-scatter leaves (chunk (rank+1) mod N complete, the
    others partial) and may only call exchange(send, recv) to talk to its neighbours. Passes if
    every rank ends with the full sum after exactly N-1 exchanges of one chunk each. Returns
    False (with a hint) while the exercise still raises NotImplementedError; raises
    AssertionError with the reason for a wrong answer.
    """
    for world in world_sizes:
        for size in sizes:
            data = [torch.arange(size, dtype=torch.float64) * 10 ** r for r in range(world)]
            total = torch.stack(data).sum(0)
            chunks = [list(total.clone().tensor_split(world)) for _ in range(world)]
            for r in range(world):  # make the chunks each rank does not own yet visibly wrong
                for c in range(world):
                    if c != (r + 1) % world:
                        chunks[r][c].fill_(-1.0)
            inbox = [queue.Queue() for _ in range(world)]
            calls = [[] for _ in range(world)]
            errors = []

            def run(r):
                def exchange(send, recv):
                    calls[r].append(send.numel())
                    inbox[(r + 1) % world].put(send.clone())
                    try:
                        got = inbox[r].get(timeout=timeout)
                    except queue.Empty:
                        raise AssertionError(f"rank {r} waited {timeout}s for its left neighbour: "
                                             "every rank must call exchange the same number of times") from None
                    if got.shape != recv.shape:
                        raise AssertionError(f"rank {r} received {got.numel()} elements into a chunk "
                                             f"of {recv.numel()}: send and receive the same chunk index "
                                             "as your neighbours")
                    recv.copy_(got)
                try:
                    fn(chunks[r], r, world, exchange)
                except BaseException as exc:  # noqa: BLE001 (reported in the main thread)
                    errors.append(exc)

            threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(world)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout * 4)
            if any(isinstance(e, NotImplementedError) for e in errors):
                print("not done yet: replace the `raise NotImplementedError` with your all-gather loop")
                return False
            if errors:
                raise AssertionError(f"world size {world}, {size} elements: {errors[0]}")
            for r in range(world):
                got = torch.cat(chunks[r])
                assert torch.equal(got, total), (f"world size {world}, {size} elements: rank {r} "
                                                 f"ends with {got.tolist()}, expected {total.tolist()}")
                assert len(calls[r]) == world - 1, (f"world size {world}: rank {r} called exchange "
                                                    f"{len(calls[r])} times, the ring needs N-1 = {world - 1}")
    print(f"all-gather correct for world sizes {list(world_sizes)} and sizes {list(sizes)}")
    return True


def main():
    from source_code.processes import spawn
    diffs = spawn(compare_with_library, 3)[0]
    worst = max(diffs.values())
    print(f"3 processes, sizes (1, 5, 1001, 4099), sum and avg: max |ours - dist.all_reduce| = {worst:.2e}")


if __name__ == "__main__":
    main()
