"""Streaming DiLoCo (Douillard et al., 2025): the model synchronised a fragment at a time.

The parameters are cut into F fragments of about equal size, either ``consecutive`` (fragment
f is the f-th stretch of the layers) or ``strided`` (the layers cut into 2F stretches, fragment
f takes stretches f and f + F: it spans the depth of the model, as the paper's strided
fragments take every F-th transformer block; the paper prefers them). Every fragment still
synchronises once per H steps, but fragment f does it at steps f H/F, f H/F + H, ...: the F
synchronisations of a round are spread over the round, so one synchronisation carries 1/F of
the model (the peak bandwidth a link must offer falls F times) while the bytes per step stay
those of DiLoCo. Each fragment has its own outer optimizer. ``average`` may send fewer bits
(``lowbit.average_fp16``, ``lowbit.average_e3m0``: 4 bits, summed in fp32).

**Overlap** (``delay=tau``, the paper's tau): a fragment's pseudo-gradient all-reduce is
issued asynchronously (``async_op=True``) and waited for tau inner steps later, so the link
works while the workers compute::

    step t:        the fragment's pseudo-gradient goes out: work = all_reduce(..., async_op=True)
    steps t+1..:   inner steps go on (local_f keeps training)
    step t + tau:  work.wait(); the fragment's outer step (notebook 18's exercise)
                   local_f = mix * local_f + (1 - mix) * global_f

``mix`` is the paper's alpha (0.5 there): how much of the tau steps' local progress a worker
keeps. With tau = 0 and mix = 0 this is exactly the synchronous version (the same all-reduce of
the same flat buffer, waited at once). ``send(flat) -> work`` starts the all-reduce; the harness
passes one whose ``wait`` also waits out a modelled slow link (``slow_link.LinkInFlight``).
``global_params`` (per fragment) is the model every worker agrees on at any step.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from source_code.less_communication.local_sgd import apply_outer, average, pseudo_gradient

PATTERNS = ("consecutive", "strided")


def _stretches(params, n: int) -> list:
    """Consecutive parameters cut into ``n`` groups of about equal numel (none empty): each
    cut goes where the running total comes closest to the next multiple of total / n."""
    if not 1 <= n <= len(params):
        raise ValueError(f"need 1 <= fragments <= {len(params)} parameters, got {n}")
    total = sum(p.numel() for p in params)
    groups, current, done = [], [], 0
    for i, p in enumerate(params):
        target = total * (len(groups) + 1) / n
        must = len(params) - i == n - len(groups) - 1          # a parameter left per group
        if current and len(groups) < n - 1 and (must or done + p.numel() - target > target - done):
            groups.append(current)
            current = []
        current.append(p)
        done += p.numel()
    groups.append(current)
    return groups


def fragments(params, n: int, pattern: str = "consecutive") -> list:
    """The parameters in ``n`` fragments, ``consecutive`` or ``strided`` (module docstring)."""
    params = list(params)
    if pattern not in PATTERNS:
        raise ValueError(f"unknown fragment pattern {pattern!r}; choose one of {', '.join(PATTERNS)}")
    if pattern == "consecutive" or 2 * n > len(params):
        return _stretches(params, n)
    pieces = _stretches(params, 2 * n)
    return [pieces[f] + pieces[f + n] for f in range(n)]


def all_reduce_async(flat):
    return dist.all_reduce(flat, async_op=True)


class StreamingDiLoCo:
    """``delay=None``: each fragment's outer step at once (``average``); ``delay=tau >= 0``:
    its all-reduce in flight for tau inner steps (see the module docstring)."""

    def __init__(self, params, every: int, n_fragments: int, outer_lr: float = 0.7,
                 outer_momentum: float = 0.9, average=average, delay: int | None = None,
                 mix: float = 0.0, send=all_reduce_async, pattern: str = "strided"):
        if every % n_fragments:
            raise ValueError(f"H={every} must be a multiple of the {n_fragments} fragments")
        if delay is not None and not 0 <= delay < every:
            raise ValueError(f"the delay tau must be in [0, H={every}): a fragment's next "
                             f"synchronisation starts H steps later; got {delay}")
        self.frags = fragments(params, n_fragments, pattern)
        self.every, self.average = every, average
        self.delay, self.mix, self.send = delay, mix, send
        self.offsets = [f * every // n_fragments for f in range(n_fragments)]
        self.global_params = [[p.detach().clone() for p in frag] for frag in self.frags]
        self.outers = [torch.optim.SGD(g, lr=outer_lr, momentum=outer_momentum, nesterov=True)
                       for g in self.global_params]
        self.in_flight = []      # (step it is due, fragment, flat pseudo-gradient, work)

    def after_inner_step(self, step: int) -> bool:
        synced = False
        for f, offset in enumerate(self.offsets):
            if (step + 1 - offset) % self.every == 0 and step + 1 >= offset:
                if self.delay is None:
                    delta = pseudo_gradient(self.global_params[f], self.frags[f])
                    self.average([delta])
                    apply_outer(self.global_params[f], self.frags[f], self.outers[f], delta)
                else:
                    self.in_flight.append(self._start(f, step))
                synced = True
        self._finish(lambda due: due <= step)
        return synced

    def finish(self) -> None:
        """Wait for every all-reduce still in flight and apply it (at the end of training)."""
        self._finish(lambda due: True)

    @torch.no_grad()
    def _start(self, f: int, step: int):
        flat = pseudo_gradient(self.global_params[f], self.frags[f])
        return step + self.delay, f, flat, self.send(flat)     # the all-reduce is in flight

    @torch.no_grad()
    def _finish(self, due_now) -> None:
        keep = []
        for item in self.in_flight:
            due, f, flat, work = item
            if not due_now(due):
                keep.append(item)
                continue
            work.wait()
            flat /= dist.get_world_size()
            apply_outer(self.global_params[f], self.frags[f], self.outers[f], flat, self.mix)
        self.in_flight = keep
