"""Notebook 04's exercise: DataParallel's step with real replicas, gradients summed by hand.

    from source_code.training.dataparallel_exercise import check_replica_step
    check_replica_step(my_replica_step)

``replica_step(module, x, y, n)`` must do what DataParallel does in one training step on n
devices, with real copies: cut the batch into ``x.chunk(n)``, run a deep copy of ``module`` on
each chunk (on one device the module itself will do, as DataParallel runs it), back-propagate, and leave in ``module``'s ``.grad`` the gradient of the mean
cross-entropy over the WHOLE batch. The check compares with autograd on the whole batch, for
even and uneven chunks (10 examples in 3 chunks are 4, 4 and 2), and makes sure that the
forward passes ran on the copies, not on the module itself.
Solution: ``source_code/solutions/nb04_dataparallel.py``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

CASES = [(8, 1), (8, 2), (12, 4), (10, 3), (7, 2)]  # (batch, devices): the last two are uneven


class _Counted(nn.Module):
    """A small classifier that counts forward calls per object (copies count separately; each is
    kept alive until the check has counted, so a copy freed early cannot lend its id to the next)."""
    calls: dict = {}
    alive: list = []

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))

    def forward(self, x):
        _Counted.calls[id(self)] = _Counted.calls.get(id(self), 0) + 1
        _Counted.alive.append(self)
        return self.net(x)


def check_replica_step(fn) -> str:
    torch.manual_seed(0)
    for batch, n in CASES:
        module = _Counted()
        x, y = torch.randn(batch, 6, dtype=torch.float64), torch.randint(0, 3, (batch,))
        module.double()
        F.cross_entropy(module.net(x), y).backward()  # the reference, without counting
        want = [p.grad.clone() for p in module.parameters()]
        module.zero_grad(set_to_none=True)
        _Counted.calls.clear()
        _Counted.alive.clear()
        try:
            fn(module, x, y, n)
        except NotImplementedError:
            raise NotImplementedError("exercise not done yet: fill in my_replica_step, then run this cell again") from None
        alone = n == 1 and list(_Counted.calls) == [id(module)]   # one device: DataParallel runs the module itself
        if _Counted.calls.get(id(module)) and not alone:
            raise AssertionError("the module itself ran forward: run a copy per device "
                                 "(hint: copy.deepcopy(module), once per chunk)")
        if not alone and len(_Counted.calls) != len(x.chunk(n)):
            raise AssertionError(f"{len(_Counted.calls)} copies ran forward for {len(x.chunk(n))} chunks: "
                                 "one copy per chunk")
        got = [p.grad for p in module.parameters()]
        if any(g is None for g in got):
            raise AssertionError("module's .grad is empty: the copies' gradients must be added into the "
                                 "module's parameters (the copies are thrown away after the step)")
        worst = max((g - w).abs().max().item() for g, w in zip(got, want))
        if worst > 1e-10:
            sizes = [len(c) for c in x.chunk(n)]
            raise AssertionError(f"batch {batch} on {n} devices (chunks {sizes}): gradient differs from the "
                                 f"whole batch's by {worst:.2e} (hint: the loss of the whole batch is a mean "
                                 "over all examples: how much does each chunk's mean weigh in it?)")
    return f"correct: equal to the whole batch's gradient for {len(CASES)} cases, even and uneven chunks"
