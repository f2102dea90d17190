"""Gradient compression through DDP's communication hooks: fp16/bf16, PowerSGD by hand, torch's.

A hook ``hook(state, bucket) -> Future[Tensor]`` replaces DDP's all-reduce of one bucket
(a flat buffer of several parameters' gradients); whatever it returns becomes their averaged
gradients. ``attach(ddp, method, rank)`` registers one of:

    full            DDP's own all-reduce (torch's allreduce_hook: what DDP does without a hook)
    fp16, bf16      torch's fp16_compress_hook / bf16_compress_hook: cast, all-reduce, cast back
    powersgd        ``powersgd_hook`` below with error feedback
    powersgd-no-ef  the same without error feedback
    torch-powersgd  torch's powerSGD_hook with its PowerSGDState, handed the Q ours starts from

PowerSGD (Vogels et al., 2019, Algorithm 1 with the error feedback of their Algorithm 2) by
hand, for each gradient matrix M (n x m) of the bucket::

    M += error                      # error feedback: what earlier steps failed to send
    P = M @ Q                       # (n, r)   Q (m, r) is last step's, a warm start
    all_reduce(P); P = orth(P)      # one orthogonalisation (QR) of the summed P
    Q = M.T @ P                     # (m, r)
    all_reduce(Q)
    approx = P @ Q.T / world        # rank r: r (n + m) numbers sent instead of n m
    error = M - approx

Vectors (biases, norms) and matrices that a rank-r pair would not shrink go through one plain
all-reduce. Each of the three all-reduces carries every matrix of the bucket at once (one
latency each, as torch does). The error is this worker's input minus the averaged
approximation, as in torch's hook and the authors' code: the compression is linear in M, so
only the sum of the workers' errors reaches the next step, and that sum is the sum of what
each worker's own compression dropped. The first ``start_iter`` steps use the plain all-reduce
(DDP rebuilds its buckets after the first step; torch requires at least 2 with error feedback).
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

METHODS = ("full", "fp16", "bf16", "powersgd", "powersgd-no-ef", "torch-powersgd")


class PowerSGDState:
    """What our hook keeps between steps: the rank, the error of each bucket, Q per matrix."""

    def __init__(self, rank: int = 2, error_feedback: bool = True, start_iter: int = 2, seed: int = 0):
        if rank < 1:
            raise ValueError(f"PowerSGD rank must be >= 1, got {rank}")
        self.rank, self.error_feedback, self.start_iter, self.seed = rank, error_feedback, start_iter, seed
        self.errors, self.qs = {}, {}
        self.iter = 0
        self.counter = None        # a mode entered around each collective only (attach's counter)


def _counted(state):
    return state.counter if state.counter is not None else contextlib.nullcontext()


def compressible(shape, rank: int) -> bool:
    """A matrix worth a rank-r pair: r (n + m) numbers fewer than n m."""
    if len(shape) < 2:
        return False
    n, m = shape[0], int(torch.Size(shape[1:]).numel())
    return rank * (n + m) < n * m


def initial_qs(mats, rank: int, seed: int, key: int) -> list:
    """The first Q of each matrix (m, r): the same on every rank (a seeded generator)."""
    g = torch.Generator().manual_seed(seed + key)
    return [torch.randn(m.shape[1], rank, generator=g) for m in mats]


def _flat_all_reduce(tensors, counted=contextlib.nullcontext()) -> None:
    """One all-reduce (sum) for a list of tensors, written back in place (inside ``counted``)."""
    if not tensors:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    with counted:
        dist.all_reduce(flat)
    offset = 0
    for t in tensors:
        t.copy_(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()


def powersgd_hook(state, bucket):                 # DDP checks hooks' annotations: none here
    world = dist.get_world_size()
    buffer = bucket.buffer()                       # flat gradients of this bucket
    key = bucket.index()
    plain = state.iter < state.start_iter
    if bucket.is_last():                           # a step ends with its last bucket
        state.iter += 1
    if plain:
        with _counted(state):
            return default_hooks.allreduce_hook(None, bucket)
    grads = bucket.gradients()                     # views into buffer, one per parameter
    mats = [g.view(g.shape[0], -1) for g in grads if compressible(g.shape, state.rank)]
    rest = [g for g in grads if not compressible(g.shape, state.rank)]
    if state.error_feedback:
        if key in state.errors:
            buffer.add_(state.errors[key])         # M += error
        wanted = buffer.clone()
    if key not in state.qs:
        state.qs[key] = [q.to(buffer) for q in initial_qs(mats, state.rank, state.seed, key)]
    qs = state.qs[key]
    _flat_all_reduce(rest, _counted(state))                  # vectors: as they are
    ps = [m @ q for m, q in zip(mats, qs)]                    # (n, r)
    _flat_all_reduce(ps, _counted(state))
    ps = [torch.linalg.qr(p).Q for p in ps]                   # orthonormal columns
    for m, p, q in zip(mats, ps, qs):
        q.copy_(m.T @ p)                                      # (m, r), kept: next step's start
    _flat_all_reduce(qs, _counted(state))
    for m, p, q in zip(mats, ps, qs):
        m.copy_(p @ q.T)                                      # rank-r sum of the gradients
    buffer.div_(world)
    if state.error_feedback:
        state.errors[key] = wanted - buffer                   # what this rank still owes
    fut = torch.futures.Future()
    fut.set_result(buffer)
    return fut


def torch_powersgd_from_our_q(state, bucket):
    """torch's powerSGD_hook, its first Q of each bucket the one ours draws (``initial_qs``).

    torch keeps its Qs in one flat buffer per bucket, the matrices grouped by shape (its
    batching order); it draws random ones only for a bucket it has no buffer for, and
    orthogonalises them at every step, which leaves P = orth(M Q) as ours computes it."""
    key = bucket.index()
    if state.iter >= state.start_powerSGD_iter and key not in state.q_memory_dict:
        r = state.matrix_approximation_rank
        mats = [g.view(g.shape[0], -1) for g in bucket.gradients() if compressible(g.shape, r)]
        qs = initial_qs(mats, r, state.random_seed_for_ours, key)
        by_shape = {}
        for m, q in zip(mats, qs):
            by_shape.setdefault(tuple(m.shape), []).append(q)
        state.q_memory_dict[key] = torch.cat([q.reshape(-1) for group in by_shape.values() for q in group]).to(bucket.buffer())
        state.p_memory_dict[key] = torch.empty(sum(m.shape[0] * r for m in mats)).to(bucket.buffer())
    return powerSGD_hook.powerSGD_hook(state, bucket)


class TorchPowerSGDState(powerSGD_hook.PowerSGDState):
    """torch's state, plus the seed of the Q ours starts from (torch's __slots__ has no room)."""
    __slots__ = ("random_seed_for_ours",)


def attach(ddp, method: str, rank: int = 2, seed: int = 0, start_iter: int = 2, wrap=None, counter=None):
    """Register ``method``'s hook on ``ddp`` (passed through ``wrap(hook)`` if given, e.g. to
    count its collectives); returns its state (None for the plain ones). Our PowerSGD hook,
    given ``counter`` (a mode such as SlowLink), enters it around each of its collectives only
    instead of being wrapped: its matrix arithmetic then runs without the mode's per-operator cost."""
    if method not in METHODS:
        raise ValueError(f"unknown compression {method!r}; choose one of {', '.join(METHODS)}")
    wrap = wrap or (lambda hook: hook)
    if method in ("full", "fp16", "bf16"):
        hook = {"full": default_hooks.allreduce_hook, "fp16": default_hooks.fp16_compress_hook,
                "bf16": default_hooks.bf16_compress_hook}[method]
        ddp.register_comm_hook(None, wrap(hook))
        return None
    if method == "torch-powersgd":
        state = TorchPowerSGDState(process_group=None, matrix_approximation_rank=rank,
                                   start_powerSGD_iter=start_iter, min_compression_rate=1,
                                   use_error_feedback=True, warm_start=True, random_seed=seed)
        state.random_seed_for_ours = seed
        ddp.register_comm_hook(state, wrap(torch_powersgd_from_our_q))
        return state
    state = PowerSGDState(rank, error_feedback=method == "powersgd", start_iter=start_iter, seed=seed)
    state.counter = counter
    ddp.register_comm_hook(state, powersgd_hook if counter is not None else wrap(powersgd_hook))
    return state
