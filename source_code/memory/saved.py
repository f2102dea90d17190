"""Count the bytes autograd keeps for the backward pass: the activations.

Every tensor an operation saves for backward passes through the saved-tensor hooks
(``torch.autograd.graph.saved_tensors_hooks``); counting the distinct storages they point at
gives the activation bytes exactly, on the CPU and on a GPU alike. Parameters that the
operations save (a linear layer keeps its weight for the input gradient) are not activations:
pass the module's parameters as ``exclude``.

    from source_code.memory.saved import saved_bytes
    n = saved_bytes(lambda: model(x).sum(), exclude=model.parameters())
"""
from __future__ import annotations

from typing import Callable, Iterable

import torch


def _key(t: torch.Tensor) -> tuple:
    storage = t.untyped_storage()
    return (t.device.type, t.device.index, storage.data_ptr())


class SavedTensors:
    """Context manager that records every storage saved for backward while it is open.

    ``bytes``: total size of the distinct storages (a view counts the storage it keeps alive);
    ``by_shape``: bytes per (dtype, shape) of the saved tensors, to read what is kept.
    """

    def __init__(self, exclude: Iterable[torch.Tensor] = ()):
        self._exclude = {_key(p) for p in exclude}
        self._seen: dict[tuple, int] = {}
        self.by_shape: dict[tuple, int] = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)

    def pack(self, t: torch.Tensor):
        key = _key(t)
        if key not in self._exclude and key not in self._seen:
            n = t.untyped_storage().nbytes()
            self._seen[key] = n
            shape = (str(t.dtype).replace("torch.", ""), tuple(t.shape))
            self.by_shape[shape] = self.by_shape.get(shape, 0) + n
        return t

    @staticmethod
    def unpack(t: torch.Tensor) -> torch.Tensor:
        return t

    @property
    def bytes(self) -> int:
        return sum(self._seen.values())

    def __enter__(self):
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)
        return False


def saved_bytes(forward: Callable[[], torch.Tensor], exclude: Iterable[torch.Tensor] = ()) -> int:
    """Bytes autograd saves while ``forward()`` runs (its result is kept until we return)."""
    with SavedTensors(exclude) as saved:
        out = forward()
    del out
    return saved.bytes
