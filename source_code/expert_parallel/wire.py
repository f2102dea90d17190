"""Bytes on the wire of expert parallelism, counted from the buffers each all-to-all is handed.

The lesson code (comm.py, ep_layer.py) is the algorithm only; this wrapper measures it from the
outside. For the duration of the block, ``torch.distributed.all_to_all_single`` is replaced by
a function that notes what it was given and then makes the real call::

    with wire.recording() as calls:
        y = ep_layer(x)
        loss.backward()
    calls[i]: {"what": "counts" | "payload", "layer": ..., "send": [rows to each rank],
               "recv": [rows from each rank], "row_bytes": ..., "sent": ..., "received": ...}

``send`` / ``recv`` are the split sizes of the call (equal splits when it was given none: the
buffer's rows / n), ``row_bytes`` the bytes of one row of the input buffer (its element size
times the numbers in a row), ``sent`` / ``received`` the bytes to and from OTHER ranks (a
rank's piece for itself stays in place). Nothing here is computed from a formula: the numbers
are the sizes of the tensors the collective really moved, which the notebook then compares with
the formula. ``recording(model)`` also tags each call with the index of the expert-parallel
layer whose forward issued it (a forward pre-hook on every layer that has ``mine``); calls from
a backward pass keep the tag of the last forward.
"""
from __future__ import annotations

import contextlib
import math

import torch
import torch.distributed as dist


class Recording(list):
    """The calls seen so far (a list of dicts), and the layer whose forward runs now."""
    layer = None

    def payload(self, layer=None) -> list:
        return [c for c in self if c["what"] == "payload" and (layer is None or c["layer"] == layer)]


def _splits(rows: int, given, n: int) -> list:
    return [int(s) for s in given] if given else [rows // n] * n


def _note(calls: Recording, output, input, output_split_sizes=None, input_split_sizes=None,
          group=None, **_) -> None:
    n, me = dist.get_world_size(group), dist.get_rank(group)
    send = _splits(input.shape[0], input_split_sizes, n)
    recv = _splits(output.shape[0], output_split_sizes, n)
    row = math.prod(input.shape[1:]) * input.element_size()
    calls.append({"what": "payload" if input.is_floating_point() else "counts", "layer": calls.layer,
                  "send": send, "recv": recv, "row_bytes": row,
                  "sent": row * (sum(send) - send[me]), "received": row * (sum(recv) - recv[me])})


@contextlib.contextmanager
def recording(model: torch.nn.Module | None = None):
    """``with recording() as calls:`` every ``dist.all_to_all_single`` of this process."""
    calls = Recording()
    real = dist.all_to_all_single

    def counted(output, input, output_split_sizes=None, input_split_sizes=None, group=None, **kw):
        _note(calls, output, input, output_split_sizes, input_split_sizes, group)
        return real(output, input, output_split_sizes, input_split_sizes, group=group, **kw)

    def tag(index):
        def hook(module, args):
            calls.layer = index
        return hook

    layers = [m for m in (model.modules() if model is not None else []) if hasattr(m, "mine")]
    hooks = [m.register_forward_pre_hook(tag(i)) for i, m in enumerate(layers)]
    dist.all_to_all_single = counted
    try:
        yield calls
    finally:
        dist.all_to_all_single = real
        for h in hooks:
            h.remove()
