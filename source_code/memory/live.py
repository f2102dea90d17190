"""Peak bytes of the tensors a block of code allocates: the CPU's stand-in for the CUDA allocator's peak.

    with LiveBytes() as live:
        loss = model(x).sum()
        after_forward = live.now     # bytes allocated since the start and still alive
        loss.backward()
    live.peak                        # the most that was alive at once

A dispatch mode sees every operation (forward and backward; the autograd engine carries it
over); each storage an operation creates that none of its inputs already had is recorded with
a weak reference, and the bytes alive are summed after each operation, dropping the storages
that died. Tensors that existed before the block (parameters, gradients allocated earlier,
optimizer state) are not counted: add them yourself. What it does not see: memory outside
tensors (the allocator's rounding and caching, Python objects, libraries' workspaces). On a
GPU ``torch.cuda.max_memory_allocated`` measures the same thing at the allocator, with its
512-byte rounding; ``gpu.py`` sets the two side by side.
"""
from __future__ import annotations

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveBytes(TorchDispatchMode):
    """``now``: bytes of storages created inside the block and still alive; ``peak``: their maximum."""

    def __init__(self):
        super().__init__()
        self._live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.now = self.peak = 0

    def _prune(self) -> None:
        dead = [k for k, (ref, _) in self._live.items() if ref.expired()]
        for k in dead:
            self.now -= self._live.pop(k)[1]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self._prune()
        inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0]
                  if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            if storage.data_ptr() in inputs:      # a view or an in-place result: nothing new
                continue
            ref = StorageWeakRef(storage)
            if ref.cdata not in self._live:
                self._live[ref.cdata] = (ref, storage.nbytes())
                self.now += storage.nbytes()
        self.peak = max(self.peak, self.now)
        return out
