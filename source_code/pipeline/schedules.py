"""Running a pipeline schedule for real: one stage per process, messages between neighbours.

``run_step`` executes one stage's ordered operations (from ``simulator.stage_order``: naive,
GPipe or 1F1B, or any order a learner writes) for one training step:

* F(i): take microbatch i's input (stage 0: the tokens; others: the activation received from
  the previous stage), run the stage, keep input and output for the backward, send the output
  on (the last stage computes the loss instead);
* B(i): backpropagate microbatch i from the gradient received from the next stage (the last
  stage: from its loss), send the gradient of the stage's input back;
* gradients of the m microbatches add up in ``.grad`` (call zero_grad before, step after).

Each operation's start and end are taken with ``time.perf_counter()``: on one machine every
process reads the same monotonic clock, so the records of all stages share one time axis
(across nodes they would not). Only computation is timed: waiting for a message is idle.
On a GPU both readings go through ``clock``, which first waits for the device (see there).

``hold`` (for measuring the bubble) makes every F last hold["F"] seconds and every B hold["B"]:
the stage computes, then holds until that time has passed, like a device of fixed speed; with
hold["scale"] also at least that many times its computation (a slower device stays that much
slower when a busy machine stretches every computation past its hold). The
formula assumes stages of equal cost; two CPU cores of a shared machine are not (one runs the
same work a few per cent slower than the other from second to second).
"""
from __future__ import annotations

import contextlib
import time

import torch

from source_code.measure import clock  # noqa: F401  (schedules.clock: the one synchronised clock)


class SavedBytes:
    """Bytes of the tensors a forward keeps for its backward (parameters excluded).

    Counted with autograd's saved-tensor hooks, plus the stage's input and output that the
    schedule itself keeps; each storage is counted once."""

    def __init__(self, module: torch.nn.Module):
        self.params = {p.untyped_storage().data_ptr() for p in module.parameters()}
        self.seen: dict[int, int] = {}

    def _add(self, t: torch.Tensor) -> None:
        st = t.untyped_storage()
        if st.data_ptr() not in self.params:
            self.seen[st.data_ptr()] = st.nbytes()

    def hooks(self):
        def pack(t):
            self._add(t)
            return t
        return torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)

    def take(self, *kept) -> int:
        for t in kept:
            if t.is_floating_point():
                self._add(t)
        total, self.seen = sum(self.seen.values()), {}
        return total




def hold_until(deadline: float) -> None:
    """Return at ``deadline`` (perf_counter seconds): sleep, then spin the last half millisecond
    (sleeping leaves the core to the message threads; spinning ends on time)."""
    left = deadline - time.perf_counter()
    if left > 5e-4:
        time.sleep(left - 5e-4)
    while time.perf_counter() < deadline:
        pass


def _needs(op, first: bool, last: bool, shape, dtype):
    """What operation ``op`` must receive before it can run: (shape, dtype, from where) or None."""
    kind, _ = op
    if kind == "F" and not first:
        return shape, dtype, "prev"     # the activation of the previous stage
    if kind == "B" and not last:
        return shape, dtype, "next"     # the gradient of the next stage
    return None


def run_step(stage, order, link, act_shape, inputs=None, targets=None, loss_fn=None,
             dtype=torch.float32, count_bytes: bool = False, hold: dict | None = None) -> dict:
    """Run ``order`` (a list of ("F" | "B", microbatch)) on this stage; return what happened.

    inputs: stage 0's microbatches (e.g. (b, t) token ids each); targets and loss_fn: the last
    stage's; act_shape: the shape of one microbatch's activation, e.g. (b, t, dim), which is
    also the shape of the gradient travelling back. Returns records (one per operation: kind,
    mb, start, end), losses (last stage), peak_in_flight and peak_bytes of stored activations.
    """
    first, last = link.stage == 0, link.stage == link.n_stages - 1
    stash, sizes = {}, {}       # mb -> (input, output) kept for the backward; mb -> their bytes
    counter = SavedBytes(stage) if count_bytes else None
    records, losses, peak_in_flight, peak_bytes = [], [], 0, 0

    inbox = link.exchange(recv=_needs(order[0], first, last, act_shape, dtype))
    for k, (kind, i) in enumerate(order):
        nxt = _needs(order[k + 1], first, last, act_shape, dtype) if k + 1 < len(order) else None
        if link.early_receives and nxt is not None:
            pending = link.post_receive(nxt)       # gloo: the next message can land while we compute
        start = clock(link.device)                 # the message it needs has arrived
        if kind == "F":
            x = inputs[i] if first else inbox.requires_grad_()      # (b, t) ids | (b, t, dim)
            with counter.hooks() if counter else contextlib.nullcontext():
                y = stage(x)                                         # (b, t, dim) | last: (b, t, vocab)
                if last:
                    y = loss_fn(y, targets[i])                       # () scalar
                    losses.append(y.detach())
            stash[i] = (x, y)
            sizes[i] = counter.take(x, y) if counter else 0
            send = None if last else (y.detach(), "next")            # activation (b, t, dim)
        else:
            x, y = stash.pop(i)
            sizes.pop(i)
            torch.autograd.backward(y, None if last else inbox)      # inbox: dL/dy (b, t, dim)
            send = None if first else (x.grad, "prev")               # dL/dx (b, t, dim)
        end = clock(link.device)                   # the computation has finished
        if hold:  # "scale": a device that many times slower, whatever else slows this one
            hold_until(start + max(hold[kind], hold.get("scale", 1) * (end - start)))
            end = time.perf_counter()
        records.append({"stage": link.stage, "kind": kind, "mb": i, "start": start, "end": end})
        peak_in_flight = max(peak_in_flight, len(stash))
        peak_bytes = max(peak_bytes, sum(sizes.values()))
        if link.early_receives:
            link.exchange(send=send)
            inbox = link.wait(pending) if nxt is not None else None
        else:  # NCCL: the message this operation produced goes out together with the one the next needs
            inbox = link.exchange(send=send, recv=nxt)
    link.flush()
    return {"records": records, "losses": [float(v) for v in losses],
            "peak_in_flight": peak_in_flight, "peak_bytes": peak_bytes}

