"""Notebook 11's exercise: the row-parallel forward and the operator behind it.

You write, in the notebook::

    class ReduceFromTP(torch.autograd.Function):   # forward: ?   backward: ?
        ...
    def row_parallel_forward(x_local, w_local, bias):
        ...                                          # (b, t, in/n), (out, in/n), (out,) -> (b, t, out)

using ``all_reduce(t)`` from this module (the sum over the ranks, out of place). Then
``check_row_parallel(row_parallel_forward)`` runs your code on 2 and 4 ranks
simulated by threads of this process (functions of a notebook cell cannot be sent to other
processes; the threads meet in a real sum) and compares the output and the gradients of x,
W and b with a dense nn.Linear. A wrong answer raises AssertionError with a hint.
The reference solution is in source_code/solutions/nb11_tensor_parallel.py.
"""
from __future__ import annotations

import threading
import time

import torch

_tls = threading.local()


class _ThreadGroup:
    """n threads that sum tensors the way dist.all_reduce sums them over n processes."""

    def __init__(self, n: int):
        self.n, self.slots = n, [None] * n
        self.barrier = threading.Barrier(n, timeout=20)

    def all_reduce(self, rank: int, t: torch.Tensor) -> torch.Tensor:
        self.slots[rank] = t.detach().clone()
        self.barrier.wait()
        total = sum(self.slots[1:], self.slots[0].clone())  # the same order on every rank
        self.barrier.wait()
        return total


def all_reduce(t: torch.Tensor) -> torch.Tensor:
    """The sum of ``t`` over all ranks, as a new tensor. Like dist.all_reduce it is not
    differentiable: autograd does not see through it."""
    group = getattr(_tls, "group", None)
    if group is not None:
        _tls.calls += 1
        return group.all_reduce(_tls.rank, t)
    import torch.distributed as dist
    out = t.detach().clone()
    dist.all_reduce(out)
    return out


# --------------------------------------------------------------------------- the check
def _run_rank(rank, n, group, fn, dense, x, g, out, errors):
    _tls.group, _tls.rank, _tls.calls = group, rank, 0
    try:
        lo, hi = rank * x.shape[-1] // n, (rank + 1) * x.shape[-1] // n
        x_local = x.detach()[..., lo:hi].clone().requires_grad_(True)
        w_local = dense.weight.detach()[:, lo:hi].clone().requires_grad_(True)
        bias = dense.bias.detach().clone().requires_grad_(True)
        y = fn(x_local, w_local, bias)
        forward_calls = _tls.calls
        if y.requires_grad:
            (y * g).sum().backward()
        out[rank] = {"y": y.detach(), "x": x_local.grad, "w": w_local.grad, "b": bias.grad,
                     "forward_calls": forward_calls, "calls": _tls.calls}
    except BaseException as exc:  # noqa: BLE001 - handed to the main thread
        errors.append(exc)
        group.barrier.abort()
    finally:
        _tls.group = None


def _simulate(fn, n: int, seed: int = 0):
    torch.manual_seed(seed)
    dense = torch.nn.Linear(8, 6)
    x = torch.randn(2, 3, 8, requires_grad=True)
    g = torch.randn(2, 3, 6)                       # dL/dy, the same on every rank
    y = dense(x)
    (y * g).sum().backward()
    group, out, errors = _ThreadGroup(n), [None] * n, []
    threads = [threading.Thread(target=_run_rank, args=(r, n, group, fn, dense, x, g, out, errors))
               for r in range(n)]
    for t in threads:
        t.start()
    _join(threads, group)
    if errors:
        first = next((e for e in errors if not isinstance(e, threading.BrokenBarrierError)), errors[0])
        if isinstance(first, NotImplementedError):
            raise NotImplementedError("exercise not done yet: fill in the TODOs, then run this cell again") from None
        if isinstance(first, threading.BrokenBarrierError):
            raise AssertionError("the ranks did not meet in all_reduce: every rank must call it the "
                                 "same number of times") from None
        raise first
    return dense, x, y.detach(), out


def _join(threads, group, patience: float = 1.0) -> None:
    """Wait for the ranks; when some have finished and the others still wait in all_reduce
    after ``patience`` seconds, nobody is coming: break the barrier instead of hanging."""
    since = None
    while any(t.is_alive() for t in threads):
        for t in threads:
            t.join(timeout=0.02)
        if any(not t.is_alive() for t in threads) and any(t.is_alive() for t in threads):
            since = since or time.monotonic()
            if time.monotonic() - since > patience:
                group.barrier.abort()
    for t in threads:
        t.join()


def _close(a, b) -> bool:
    return a is not None and a.shape == b.shape and torch.allclose(a, b, atol=1e-5)


def check_row_parallel(fn) -> str:
    """Your ``row_parallel_forward(x_local, w_local, bias)`` (and the ReduceFromTP it uses) on 2
    and 4 simulated ranks against a dense nn.Linear: output, gradients, collectives."""
    for n in (2, 4):
        dense, x, y, out = _simulate(fn, n)
        where = f"{n} ranks"
        for rank, r in enumerate(out):
            lo, hi = rank * 8 // n, (rank + 1) * 8 // n
            if not _close(r["y"], y):
                partial = x.detach()[..., lo:hi] @ dense.weight.detach()[:, lo:hi].T
                if _close(r["y"], partial + dense.bias.detach()) or _close(r["y"], partial):
                    raise AssertionError(f"{where}, rank {rank}: the output is only this rank's "
                                         "partial product. Hint: the full output is the SUM of "
                                         "every rank's x_r @ W_r^T: which collective makes it?")
                if _close(r["y"], y + (n - 1) * dense.bias.detach()):
                    raise AssertionError(f"{where}: the bias appears {n} times in the output. Hint: "
                                         "add it after the sum, not to each partial product")
                raise AssertionError(f"{where}, rank {rank}: the output differs from the dense "
                                     "layer's. Hint: x_local @ w_local.T is (b, t, out)")
            if r["w"] is None or r["x"] is None:
                raise AssertionError(f"{where}: no gradient reached x_local / w_local. Hint: "
                                     "all_reduce is invisible to autograd; call it inside "
                                     "ReduceFromTP.forward and use ReduceFromTP.apply(...)")
            want_w, want_x = dense.weight.grad[:, lo:hi], x.grad[..., lo:hi]
            if _close(r["w"], n * want_w) or _close(r["x"], n * want_x):
                raise AssertionError(f"{where}: the gradients are {n} times too large. Hint: every "
                                     "rank already holds the full dL/dy; summing it over the ranks "
                                     "in backward counts it once per rank. What is d(sum)/d(summand)?")
            if not (_close(r["w"], want_w) and _close(r["x"], want_x)):
                raise AssertionError(f"{where}, rank {rank}: the gradients of x_local / w_local "
                                     "differ from the dense layer's slices. Hint: backward returns "
                                     "the gradient for the partial product")
            if not _close(r["b"], dense.bias.grad):
                raise AssertionError(f"{where}: the bias gradient is wrong. Hint: the bias is "
                                     "added once to the full output")
            if r["forward_calls"] != 1 or r["calls"] != 1:
                raise AssertionError(f"{where}: {r['forward_calls']} all-reduce(s) forward, "
                                     f"{r['calls'] - r['forward_calls']} backward; the design is "
                                     "1 forward and 0 backward")
    msg = ("correct: output and gradients equal the dense layer on 2 and 4 ranks, with one "
           "all-reduce forward and none backward")
    print(msg)
    return msg
