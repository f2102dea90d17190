"""Own ring all-reduce, naive ring and parameter-server all-reduce (sync/comms.py) vs dist.all_reduce.

The segmented ring is checked three ways:
* on real processes (gloo) against dist.all_reduce, for the sizes where the chunk lengths of one
  rank's send and receive fall on different sides of a segment boundary, for group sizes 2-8;
* with threads as ranks and a fake ``batch_isend_irecv`` that returns its Works as NCCL does (one
  Work for the whole batch) and as gloo does (one Work per operation); in both, data moves only
  when wait() is called, so reading a receive buffer before its whole batch is waited on shows;
* on 2-4 processes with all implementations (``compare_with_library``).
"""
import queue
import threading

import pytest
import torch
import torch.distributed as dist

from source_code.processes import spawn
from source_code.sync.comms import RingNeighbours, all_gather_phase, reduce_scatter_phase, ring_all_reduce
from source_code.sync.harness import compare_with_library

SIZES = (1, 5, 1001, 4099)  # smaller than, and not divisible by, the world sizes
PER_SEGMENT = 2             # elements per segment in the boundary tests: float64, 16-byte segments
SEGMENT_BYTES = PER_SEGMENT * 8


def boundary_sizes(world: int, per_segment: int = PER_SEGMENT) -> list:
    """Tensor sizes around the points where the two chunk lengths need different segment counts.

    n = world * q + r elements give chunks of q + 1 (the first r) and q elements. A rank's send and
    receive are different chunks, so with q a multiple of the segment length (q = 0, one segment,
    two segments) and 0 < r < world one of them needs one segment more than the other."""
    return sorted({world * q + r for q in (0, per_segment, 2 * per_segment) for r in range(-1, world + 1)
                   if world * q + r > 0})


@pytest.mark.parity
@pytest.mark.parametrize("world", [2, 3])  # 4 processes: notebook 02 runs it and asserts the same
def test_implementations_match_dist_all_reduce(world):
    # "ring_small_segments" cuts chunks into 64-byte segments: the pipelined path of big buffers
    diffs = spawn(compare_with_library, world, SIZES)
    for rank_diffs in diffs:
        assert set(rank_diffs) == {(impl, size, op) for impl in ("ring", "ring_small_segments", "naive_ring", "parameter_server")
                                   for size in SIZES for op in ("sum", "avg")}
        worst = max(rank_diffs.values())
        assert worst < 1e-12, rank_diffs


# --------------------------------------------------------------------------- real processes
def _boundary_cases(group_sizes, default_segment_sizes):
    """Run on every rank: for each group size w the last w ranks form a group (group rank !=
    global rank); ring_all_reduce with tiny segments on the boundary sizes, and with the default
    segments on ``default_segment_sizes[w]`` (float32), compared with dist.all_reduce.

    Integer-valued data, so every order of summation gives the same bits. Returns
    {(w, n, segment_bytes): equal} for the cases this rank took part in."""
    rank, full = dist.get_rank(), dist.get_world_size()
    out = {}
    for w in group_sizes:
        members = list(range(full - w, full))
        group = None if w == full else dist.new_group(members)  # every rank calls new_group
        if rank not in members:
            continue
        cases = [(n, torch.float64, SEGMENT_BYTES) for n in boundary_sizes(w)]
        cases += [(n, torch.float32, None) for n in default_segment_sizes.get(w, ())]
        for n, dtype, segment_bytes in cases:
            gen = torch.Generator().manual_seed(1000 * rank + n)
            x = torch.randint(-100, 100, (n,), generator=gen).to(dtype)
            expected = x.clone()
            dist.all_reduce(expected, group=group)
            extra = {} if segment_bytes is None else {"segment_bytes": segment_bytes}
            got = ring_all_reduce(x.clone(), "sum", group, **extra)
            out[(w, n, segment_bytes)] = torch.equal(got, expected)
    return out


@pytest.mark.parity
def test_segment_boundary_sizes_on_real_processes():
    # one start of 8 processes; groups of 2..8 of them give the world sizes 2-8 (8: the default group)
    per_default_segment = 2**20 // 4  # float32 elements in the default 1 MiB segment
    default_sizes = {2: [2 * per_default_segment + 1]}  # chunk lengths straddle 1 MiB
    results = spawn(_boundary_cases, 8, range(2, 9), default_sizes)
    for w in range(2, 9):
        for rank in range(8 - w, 8):
            expected_keys = {(w, n, SEGMENT_BYTES) for n in boundary_sizes(w)}
            expected_keys |= {(w, n, None) for n in default_sizes.get(w, ())}
            got = {k: v for k, v in results[rank].items() if k[0] == w}
            assert set(got) == expected_keys
            assert all(got.values()), {k: v for k, v in got.items() if not v}


# --------------------------------------------------------------------------- fake backends
class FakeWork:
    """A Work of the fake batch_isend_irecv: the data moves only when wait() is called."""

    def __init__(self, links, sends=(), receives=()):
        self.links, self.sends, self.receives = links, list(sends), list(receives)

    def wait(self, timeout: float = 5.0):
        for t in self.sends:
            self.links.mailboxes[self.links.right].put(t.clone())
        for t in self.receives:
            try:
                got = self.links.mailboxes[self.links.rank].get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(f"rank {self.links.rank}: nothing arrived from the left in {timeout}s") from None
            if got.shape != t.shape:  # gloo aborts the process here
                raise AssertionError(f"rank {self.links.rank}: size mismatch, {got.numel()} elements sent "
                                     f"into a receive of {t.numel()}")
            t.copy_(got)
        self.sends, self.receives = [], []
        return True


class FakeLinks(RingNeighbours):
    """RingNeighbours with threads as ranks. ``backend="nccl"``: one Work for the whole batch, whose wait()
    completes every operation; ``"gloo"``: one Work per operation. Receive buffers hold NaN until
    their Work is waited on."""

    def __init__(self, rank, world, mailboxes, backend):
        super().__init__((rank + 1) % world, (rank - 1) % world)
        self.rank, self.mailboxes, self.backend = rank, mailboxes, backend

    def post(self, send, recv):
        sends = [send] if send is not None and send.numel() > 0 else []
        receives = [recv] if recv is not None and recv.numel() > 0 else []
        for t in receives:
            t.fill_(float("nan"))  # what a receive buffer holds before the data has arrived
        if not sends and not receives:
            return []
        if self.backend == "nccl":
            return [FakeWork(self, sends, receives)]
        return [FakeWork(self, sends=[t]) for t in sends] + [FakeWork(self, receives=[t]) for t in receives]


def ring_on_threads(data, backend, segment_bytes, links_class=None):
    """ring_all_reduce's two phases with one thread per rank over FakeLinks; returns each rank's result."""
    world = len(data)
    tensors = [d.clone() for d in data]
    mailboxes = [queue.Queue() for _ in range(world)]
    errors = []

    def run(rank):
        try:
            links = (links_class or FakeLinks)(rank, world, mailboxes, backend)
            chunks = list(tensors[rank].tensor_split(world))
            reduce_scatter_phase(chunks, rank, world, links, segment_bytes)
            all_gather_phase(chunks, rank, world, links.exchange)
        except BaseException as exc:  # noqa: BLE001 (reported by the test)
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    if errors:
        raise errors[0]
    assert not any(t.is_alive() for t in threads), "a rank never finished"
    return tensors


@pytest.mark.parametrize("backend", ["nccl", "gloo"])
def test_fake_links_return_works_as_the_backend_does(backend):
    mailboxes = [queue.Queue() for _ in range(2)]
    links = FakeLinks(0, 2, mailboxes, backend)
    send, recv = torch.ones(3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64)
    works = links.post(send, recv)
    assert len(works) == (1 if backend == "nccl" else 2)
    assert recv.isnan().all()  # nothing has arrived before wait()
    mailboxes[0].put(torch.full((3,), 7.0, dtype=torch.float64))  # what rank 1 sends
    for w in works:
        w.wait()
    assert torch.equal(recv, torch.full((3,), 7.0, dtype=torch.float64))
    assert torch.equal(mailboxes[1].get_nowait(), send)


@pytest.mark.parametrize("backend", ["nccl", "gloo"])
@pytest.mark.parametrize("world", range(2, 9))
def test_segmented_ring_sums_with_either_kind_of_works(backend, world):
    sizes = boundary_sizes(world) + [1001]
    for n in sizes:
        data = [torch.randint(-100, 100, (n,), generator=torch.Generator().manual_seed(10 * r + n)).double()
                for r in range(world)]
        total = torch.stack(data).sum(0)
        for segment_bytes in (SEGMENT_BYTES, 2**20):
            for rank, got in enumerate(ring_on_threads(data, backend, segment_bytes)):
                assert torch.equal(got, total), (f"{backend}, world {world}, {n} elements, "
                                                 f"{segment_bytes}-byte segments: rank {rank} wrong")


class PerOperationWorks(FakeLinks):
    """The old assumption: the Works after the sends' ones belong to the receives (gloo's list).
    With NCCL's single Work for the batch, that leaves nothing to wait on for the receives."""

    def post(self, send, recv):
        works = super().post(send, recv)
        n_send = 1 if send is not None and send.numel() > 0 else 0
        return works[n_send:]


def test_fake_nccl_catches_a_ring_that_assumes_one_work_per_operation():
    world, n = 3, 40
    data = [torch.arange(n, dtype=torch.float64) * (r + 1) for r in range(world)]
    results = ring_on_threads(data, "nccl", SEGMENT_BYTES, links_class=PerOperationWorks)
    assert all(got.isnan().any() for got in results)  # the receives were read before they arrived
