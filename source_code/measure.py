"""Counting what sharding saves: tensor bytes per rank, bytes on the wire, peak process memory.

* ``tensor_bytes(tensors)``: bytes of the distinct storages behind ``tensors`` (a view of a
  parameter is not counted twice; a DTensor counts its local shard only);
* ``state_bytes(model, optimizer)``: parameters, gradients and optimizer state held by this rank;
* ``CommCounter``: a dispatch mode that sees every c10d collective issued on this thread (ours,
  DDP's reducer, FSDP2's) and adds up its payload and the bytes a ring/bandwidth-optimal
  algorithm sends per rank for it;
* ``PeakRSS(device)``: peak memory of the computing device over a block of code: on the CPU
  the resident memory of this process (Linux /proc), reset at the start, meaningful with
  MALLOC_MMAP_THRESHOLD_=65536 so freed memory goes back to the OS; on a GPU
  torch.cuda.max_memory_allocated of that GPU. A rank on the CPU never calls into CUDA (which
  would create a CUDA context, hundreds of MiB, on a GPU that another rank may be using);
* ``clock(device)``: perf_counter once the device has done its queued work (CUDA synchronised):
  the one clock for timing a step, a transfer or a stage on any device;
* ``table_device(counts)``: one kind of device for every row of a table over process counts
  (1, 2, 4 ...), and the line that says which.
"""
from __future__ import annotations

import sys
import time
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from source_code import device_policy


def _loaded_dtensor():
    """DTensor's class if its module is loaded, else None: a DTensor exists only once it is, and
    importing it costs a process that never makes one about a CPU-second (it pulls in sympy)."""
    for name in ("torch.distributed.tensor", "torch.distributed._tensor"):   # public from 2.5 on
        cls = getattr(sys.modules.get(name), "DTensor", None)
        if cls is not None:
            return cls
    return None


def is_dtensor(t) -> bool:
    cls = _loaded_dtensor()
    return cls is not None and isinstance(t, cls)


def local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard, any other tensor itself."""
    return t.to_local() if is_dtensor(t) else t


def __getattr__(name):   # ``from source_code.measure import DTensor`` imports it when asked
    if name == "DTensor":
        try:
            from torch.distributed.tensor import DTensor
        except ImportError:  # pragma: no cover - older torch
            from torch.distributed._tensor import DTensor
        return DTensor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def tensor_bytes(tensors, exclude=()) -> int:
    """Bytes of the distinct storages of ``tensors`` (None skipped), minus those in ``exclude``."""
    seen = {local(t).untyped_storage().data_ptr() for t in exclude if t is not None}
    total = 0
    for t in tensors:
        if t is None:
            continue
        s = local(t).untyped_storage()
        if s.data_ptr() not in seen and s.nbytes():
            seen.add(s.data_ptr())
            total += s.nbytes()
    return total


def optimizer_tensors(optimizer) -> list:
    inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer wraps a local optimizer
    inner = getattr(inner, "inner", inner)          # ZeroAdamW (zero.py) too
    return [v for state in inner.state.values() for v in state.values() if torch.is_tensor(v)]


def state_bytes(model, optimizer, extra_params=(), extra_grads=()) -> dict:
    """Bytes this rank holds now: parameters, gradients, optimizer state (storages counted once)."""
    # ZeroAdamW's shards are views of the parameters (no new bytes) whose .grad is this rank's
    # gradient chunk
    params = list(model.parameters()) + list(getattr(optimizer, "shards", [])) + list(extra_params)
    p = tensor_bytes(params)
    g = tensor_bytes([q.grad for q in params] + list(extra_grads))
    o = tensor_bytes(optimizer_tensors(optimizer))
    return {"params": p, "grads": g, "optimizer": o, "total": p + g + o}


# --------------------------------------------------------------------------- communication
# c10d op -> (kind, which argument holds the full data, factor of (N-1)/N x bytes per rank)
_COLLECTIVES = {
    "allreduce_": ("all_reduce", 0, 2),
    "broadcast_": ("broadcast", 0, 1),
    "_allgather_base_": ("all_gather", 0, 1),          # (output N x chunk, input chunk)
    "allgather_": ("all_gather", 0, 1),
    "allgather_into_tensor_coalesced_": ("all_gather", 0, 1),
    "_reduce_scatter_base_": ("reduce_scatter", 1, 1),  # (output chunk, input N x chunk)
    "reduce_scatter_": ("reduce_scatter", 1, 1),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter", 1, 1),
}


def _tensors(x):
    if torch.is_tensor(x):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _tensors(y)


class CommCounter(TorchDispatchMode):
    """``with CommCounter(world_size) as c: ...``: c.calls, c.payload, c.wire (bytes per rank).

    payload[kind]: bytes of the full data of each collective (the all-reduced buffer, the
    gathered output, the reduce-scattered input); wire: what each rank sends for it with a
    bandwidth-optimal algorithm, 2(N-1)/N x payload for all-reduce, (N-1)/N x payload otherwise.
    ``ops`` keeps (kind, payload bytes) in issue order.
    """

    def __init__(self, world_size: int):
        super().__init__()
        self.n = world_size
        self.calls, self.payload = Counter(), Counter()
        self.wire = 0.0
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.name().split("::")[-1].split(".")[0]
        if func.namespace == "c10d" and name in _COLLECTIVES:
            kind, arg, factor = _COLLECTIVES[name]
            full = sum(t.numel() * t.element_size() for t in _tensors(args[arg]))
            self.calls[kind] += 1
            self.payload[kind] += full
            self.wire += factor * (self.n - 1) / self.n * full
            self.ops.append((kind, full))
        return func(*args, **(kwargs or {}))


# --------------------------------------------------------------------------- process memory
def rss_bytes(field: str = "VmRSS") -> int:
    """This process's resident memory (VmRSS) or its peak since the last reset (VmHWM)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


class PeakRSS:
    """``with PeakRSS(device) as m: ...``; m.peak_bytes = peak bytes above the start on ``device``.

    CPU: writing 5 to /proc/self/clear_refs resets the kernel's high-water mark (VmHWM) to the
    current RSS, so the peak belongs to this block only (``m.peak_delta``). CUDA: the GPU's
    peak allocated bytes, reset at the start (``m.cuda_peak_delta``). CUDA is asked only when
    ``device`` is a CUDA device: a process computing on the CPU creates no CUDA context.
    """

    def __init__(self, device="cpu"):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"

    def __enter__(self):
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass
        self.start = rss_bytes()
        self.start_cuda = 0
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
            self.start_cuda = torch.cuda.memory_allocated(self.device)
        return self

    def __exit__(self, *exc):
        self.peak_delta = max(rss_bytes("VmHWM") - self.start, 0)
        self.cuda_peak_delta = (torch.cuda.max_memory_allocated(self.device) - self.start_cuda
                                if self.cuda else 0)
        return False

    @property
    def peak_bytes(self) -> int:
        """The peak of the device the block computed on: GPU bytes on CUDA, else resident bytes."""
        return self.cuda_peak_delta if self.cuda else self.peak_delta


# --------------------------------------------------------------------------- one device per table
def table_device(counts, env=None, gpus: device_policy.Gpus | None = None) -> tuple[str, str]:
    """(``device`` for processes.spawn/torchrun, the line a table prints) for a table whose rows
    run 1, 2, 4 ... processes (``counts``): every row on the same kind of device, so that rows
    can be divided by each other. The GPU only when the largest row gets one GPU per process
    (the device policy's answer for that many processes on this node), else the CPU for every
    row, said in the line, e.g. "device: cpu (1 GPU < 4 processes)"."""
    largest = max(counts)
    gpus = device_policy.Gpus.probe() if gpus is None else gpus
    placed = device_policy.choose(0, largest, env=env, gpus=gpus)
    if placed.device.type == "cuda":
        return "auto", f"device: cuda (one GPU per process, {gpus.count} GPUs >= {largest} processes)"
    if not gpus.available:
        why = "no GPU"
    elif gpus.count < largest:
        why = f"{gpus.count} GPU{'s' if gpus.count > 1 else ''} < {largest} processes"
    else:
        why = "asked for: WORKSHOP_DEVICE=cpu"
    return "cpu", f"device: cpu ({why}): every row on the CPU"

def clock(device) -> float:
    """``time.perf_counter()`` once ``device`` has finished everything queued on it so far.

    On a GPU the CPU runs ahead: a forward returns when its kernels are queued, and NCCL's
    ``Work.wait()`` makes the compute stream wait for a receive, not the CPU. A start read right
    after a receive's ``wait()`` would count the wait for the message as busy time, and an end
    read after the forward's call would come before the GPU did the work. So on CUDA the clock
    is read after ``torch.cuda.synchronize`` (every stream of the device: compute and NCCL's):
    after a receive it says when the message was there, after a computation when it was done.
    On the CPU gloo's ``wait()`` blocks and operators compute when called: read it at once."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()
