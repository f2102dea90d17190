"""A bucketed DDP that overlaps the gradient all-reduce with backward(), as torch's DDP does.

    model = BucketedDDP(net, bucket_mb=0.25)
    loss_fn(model(x), y).backward()  # buckets are all-reduced while backward() still runs
    optimizer.step()                 # the same loop as with torch's DDP

    BucketedDDP(net, overlap=False)     # the same buckets, sent only after backward() is over
    BucketedDDP(net, grad_views=True)   # .grad are views into the bucket buffers: no copies

How: backward() produces gradients roughly in reverse order of the parameters (the last
layer's first). The parameters are grouped, in that reverse order, into buckets of about
``bucket_mb`` megabytes. A hook registered with ``Tensor.register_post_accumulate_grad_hook``
runs as soon as a parameter's gradient is final; when the last parameter of a bucket is ready,
the bucket's gradients are flattened into one buffer, divided by the world size and handed to
an asynchronous ``all_reduce`` -- while autograd goes on computing earlier layers' gradients.
The hook that sees the last gradient of the step (``_finish``) waits for every bucket and
copies the averaged values back into ``.grad``, so backward() returns with averaged gradients,
as with torch's DDP. Fewer, larger messages (less latency paid) and overlap with
computation: the two ideas of torch's DDP Reducer.

Two switches separate the ideas in a measurement (compare.py runs them side by side):
``overlap=False`` keeps the buckets but sends them all after backward() (bucketing without
overlap); ``grad_views=True`` does what torch's DDP does with ``gradient_as_bucket_view=True``:
every ``.grad`` is a view into its bucket's flat buffer, so autograd accumulates straight into
the buffer that is all-reduced; the copy into the buffer and the copy back disappear.
(torch's DDP also re-orders its buckets after the first step to the order in which gradients
really arrived; here the reverse parameter order is kept.)

Dividing: each rank divides its gradients by the world size BEFORE the all-reduce sums them,
as torch's DDP does (the sum of the divided values is the mean; see naive.py).

``no_sync()`` skips the communication (gradients keep accumulating locally), for gradient
accumulation; see no_sync.py.
Run in the comparison: ``torchrun --standalone --nproc-per-node=2 -m source_code.ddp_internals.compare``.
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch import nn

from source_code.ddp_internals.naive import broadcast_parameters, check_step_finished


def make_buckets(params: list[nn.Parameter], bucket_bytes: int) -> list[list[nn.Parameter]]:
    """Group ``params`` in REVERSE order into buckets of at least ``bucket_bytes`` (the last may be smaller).

    Reverse order because backward() finishes the last layers first: their bucket fills first
    and its all-reduce can start earliest.
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket size must be positive, got {bucket_bytes} bytes; pass e.g. bucket_mb=0.25")
    buckets, current, size = [], [], 0
    for p in reversed(params):
        current.append(p)
        size += p.numel() * p.element_size()
        if size >= bucket_bytes:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


class BucketedDDP(nn.Module):
    """Wrap ``module`` and train as with torch's DDP: ``loss.backward(); optimizer.step()``."""

    def __init__(self, module: nn.Module, bucket_mb: float = 0.25, overlap: bool = True,
                 grad_views: bool = False):
        super().__init__()
        self.module = module
        self.world_size = dist.get_world_size()
        self.overlap, self.grad_views = overlap, grad_views
        broadcast_parameters(module)
        params = [p for p in module.parameters() if p.requires_grad]
        self.buckets = make_buckets(params, int(bucket_mb * 2**20))
        self._bucket_of = {p: i for i, b in enumerate(self.buckets) for p in b}
        self._ready = [0] * len(self.buckets)  # per bucket: gradients final in this backward()
        self._n_ready, self._n_params = 0, len(params)
        self._pending: list[tuple[dist.Work, int, torch.Tensor]] = []
        self._waited: list[dist.Work] = []  # the last step's handles, kept (see _finish)
        self.require_sync = True
        self.collectives = 0  # all_reduce calls issued so far (each from a hook, during backward)
        self._handles = [p.register_post_accumulate_grad_hook(self._on_grad_ready) for p in params]
        # grad_views: one flat buffer per bucket; each parameter's .grad is a slice of it
        self._flat = [torch.zeros(sum(p.numel() for p in b), dtype=b[0].dtype, device=b[0].device)
                      for b in self.buckets] if grad_views else []
        self._views = [torch.split(flat, [p.numel() for p in b]) for flat, b in zip(self._flat, self.buckets)]

    def forward(self, *args, **kwargs):
        check_step_finished(self._n_ready, self._n_params)
        if self.grad_views:
            self._attach_grad_views()
        return self.module(*args, **kwargs)

    @torch.no_grad()
    def _attach_grad_views(self) -> None:
        """Before backward: point every missing .grad at its (zeroed) slice of the bucket buffer."""
        for flat, bucket, views in zip(self._flat, self.buckets, self._views):
            if all(p.grad is not None and p.grad.data_ptr() == v.data_ptr() for p, v in zip(bucket, views)):
                continue  # still attached (zero_grad(set_to_none=False) zeroed them in place)
            flat.zero_()
            for p, v in zip(bucket, views):
                p.grad = v.view_as(p)

    @contextlib.contextmanager
    def no_sync(self):
        """Inside: backward() only accumulates local gradients; the next synced backward averages the sum."""
        previous, self.require_sync = self.require_sync, False
        try:
            yield
        finally:
            self.require_sync = previous

    @torch.no_grad()
    def _on_grad_ready(self, param: torch.Tensor) -> None:
        if not self.require_sync:
            return
        i = self._bucket_of[param]
        self._ready[i] += 1
        if self._ready[i] == len(self.buckets[i]) and self.overlap:  # full: send it now
            self._send(i)
        self._n_ready += 1
        if self._n_ready == self._n_params:  # the last gradient of this backward()
            self._finish()

    def _send(self, i: int) -> None:
        if self.grad_views:  # the gradients already live in the buffer
            flat = self._flat[i]
        else:
            flat = torch.cat([p.grad.reshape(-1) for p in self.buckets[i]])
        flat.div_(self.world_size)  # divide first, then SUM = mean (as torch's DDP does)
        work = dist.all_reduce(flat, op=dist.ReduceOp.SUM, async_op=True)
        self._pending.append((work, i, flat))
        self.collectives += 1

    def _finish(self) -> None:
        """Wait for every bucket's all-reduce and write the averaged gradients back."""
        if not self.overlap:  # backward is over: now send every bucket
            for i in range(len(self.buckets)):
                self._send(i)
        for work, i, flat in self._pending:
            work.wait()
            if self.grad_views:
                continue  # .grad are views of flat: already the means
            offset = 0
            for p in self.buckets[i]:
                n = p.numel()
                p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
                offset += n
        # Keep this step's handles until the next step's are waited for, as torch's DDP keeps
        # its buckets' work. A collective issued inside backward() carries a Python object (the
        # backward's context) that only a thread holding the GIL may release; if our handle were
        # dropped first, gloo's worker thread would drop the last reference and, when that falls
        # on the interpreter's exit, it cannot take the GIL and the process aborts ("terminate
        # called without an active exception"). Kept here, the last reference is always ours.
        self._waited = [work for work, _, _ in self._pending]
        self._pending.clear()
        self._ready = [0] * len(self.buckets)
        self._n_ready = 0

    def remove_hooks(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
