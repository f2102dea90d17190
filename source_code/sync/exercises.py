"""Check functions for the exercises of notebooks 02 and 03 (solutions: source_code/solutions/).

    from source_code.sync.exercises import check_all_gather, check_p2p_all_gather
    check_all_gather(my_all_gather)          # notebook 02: the all-gather half of the ring
    check_p2p_all_gather(my_p2p_all_gather)  # notebook 03: all-gather from send/recv, 3 processes

A wrong answer raises AssertionError saying what is wrong; an unfinished one
(NotImplementedError) prints "not done yet" and returns False.
"""
from __future__ import annotations

import inspect
import queue
import textwrap
import threading
import warnings

import torch
import torch.distributed as dist

from source_code.sync.comms import wait_all

# the check compares with dist.all_gather_into_tensor, which torch >= 2.13 marks deprecated but
# which is the plain call that also works on torch 2.6 (see collectives.py)
warnings.filterwarnings("ignore", message=".*all_gather_into_tensor.*", category=FutureWarning)


# --------------------------------------------------------------------------- notebook 02
def check_all_gather(fn, world_sizes=(2, 3, 4), sizes=(12, 7, 3), timeout: float = 5.0) -> bool:
    """Check an all-gather phase ``fn(chunks, rank, world, exchange)`` with threads as ranks.

    Every "rank" starts from the state reduce-scatter leaves (chunk (rank+1) mod N complete, the
    others partial: filled with -1) and may only call exchange(send, recv) to talk to its
    neighbours. Passes if every rank ends with the full sum after exactly N-1 exchanges."""
    for world in world_sizes:
        for size in sizes:
            data = [torch.arange(size, dtype=torch.float64) * 10 ** r for r in range(world)]
            total = torch.stack(data).sum(0)
            chunks = [list(total.clone().tensor_split(world)) for _ in range(world)]
            for r in range(world):
                for c in range(world):
                    if c != (r + 1) % world:
                        chunks[r][c].fill_(-1.0)
            inbox = [queue.Queue() for _ in range(world)]  # inbox[r]: messages from rank r - 1
            calls = [0] * world
            errors = []
            threads = [threading.Thread(target=_thread_rank, daemon=True,
                                        args=(fn, r, world, chunks[r], inbox, calls, errors, timeout))
                       for r in range(world)]
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
                assert calls[r] == world - 1, (f"world size {world}: rank {r} called exchange "
                                               f"{calls[r]} times, the ring needs N-1 = {world - 1}")
    print(f"all-gather correct for world sizes {list(world_sizes)} and sizes {list(sizes)}")
    return True


def _thread_rank(fn, r, world, my_chunks, inbox, calls, errors, timeout):
    """One "rank" of check_all_gather: ``exchange`` puts into the right neighbour's inbox and
    takes from ours."""
    def exchange(send, recv):
        calls[r] += 1
        inbox[(r + 1) % world].put(send.clone())
        try:
            got = inbox[r].get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"rank {r} waited {timeout}s for its left neighbour: "
                                 "every rank must call exchange the same number of times") from None
        if got.shape != recv.shape:
            raise AssertionError(f"rank {r} received {got.numel()} elements into a chunk of "
                                 f"{recv.numel()}: send and receive the same chunk index as your neighbours")
        recv.copy_(got)
    try:
        fn(my_chunks, r, world, exchange)
    except BaseException as exc:  # noqa: BLE001 (reported in the main thread)
        errors.append(exc)


# --------------------------------------------------------------------------- notebook 03
FORBIDDEN = ("all_gather", "all_gather_into_tensor", "all_gather_object", "all_reduce", "broadcast")


def _forbidden(name):
    def call(*args, **kwargs):
        raise AssertionError(f"dist.{name} is not allowed in this exercise: use point-to-point "
                             "messages (dist.P2POp, dist.batch_isend_irecv)")
    return call


def _run_p2p_all_gather(source: str, name: str, sizes) -> dict:
    """On every rank: define the learner's function from its source, run it for each size with
    the collectives switched off, and compare with dist.all_gather_into_tensor."""
    namespace = {"torch": torch, "dist": dist, "wait_all": wait_all}
    exec(compile(source, "<exercise>", "exec"), namespace)  # a notebook cell's function cannot be pickled
    fn = namespace[name]
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    for n in sizes:
        x = torch.arange(n, dtype=torch.float32) + 100 * rank          # [n]: recognisable per rank
        expected = torch.empty(world * n)                               # [world * n]
        dist.all_gather_into_tensor(expected, x)
        got = torch.full((world * n,), float("nan"))                    # [world * n]
        saved = {f: getattr(dist, f) for f in FORBIDDEN}
        try:
            for f in FORBIDDEN:
                setattr(dist, f, _forbidden(f))
            fn(got, x)
            out[n] = ("ok" if torch.equal(got, expected) else
                      f"rank {rank}, {n} elements per rank: got {got.tolist()}, expected {expected.tolist()}")
        except NotImplementedError:
            out[n] = "not done"
        except Exception as exc:  # noqa: BLE001 (reported by the check)
            out[n] = f"rank {rank}: {type(exc).__name__}: {exc}"
        finally:
            for f, original in saved.items():
                setattr(dist, f, original)
        if not torch.equal(x, torch.arange(n, dtype=torch.float32) + 100 * rank):
            out[n] = f"rank {rank}: the input x was changed; all-gather only reads it"
    return out


def check_p2p_all_gather(fn, world_size: int = 3, sizes=(1, 4)) -> bool:
    """Run ``fn(output, x)`` on ``world_size`` real processes: afterwards ``output`` ([N * n])
    must hold rank r's ``x`` ([n]) in elements r*n ... (r+1)*n - 1 on every rank, as
    dist.all_gather_into_tensor gives, using point-to-point messages only."""
    from source_code.processes import spawn
    source = textwrap.dedent(inspect.getsource(fn))
    per_rank = spawn(_run_p2p_all_gather, world_size, source, fn.__name__, list(sizes))
    verdicts = [v for rank_out in per_rank for v in rank_out.values()]
    if "not done" in verdicts:
        print("not done yet: replace the `raise NotImplementedError` with your sends and receives")
        return False
    wrong = [v for v in verdicts if v != "ok"]
    if wrong:
        raise AssertionError(wrong[0])
    print(f"all-gather from point-to-point messages correct on {world_size} processes, "
          f"{list(sizes)} elements per rank")
    return True
