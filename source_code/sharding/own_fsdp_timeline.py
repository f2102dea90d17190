"""One training step of FSDP by hand on a timeline, from measured timestamps: serial vs overlapped.

    torchrun --standalone --nproc-per-node=4 -m source_code.sharding.own_fsdp_report   # runs it

``record(units, device, phase)`` wraps each PrefetchUnit's methods (the lesson code stays as it
is) and stamps with measure.clock: when each all-gather is issued and when its bytes have
arrived (the Work's future completes, on gloo's thread); when each unit computes, in forward
(its forward hooks) and in backward (from its gather's end to its full gradient); when each
reduce-scatter is issued, arrives, and is waited for; and, given the model, each replicated
parameter's blocking all-reduce (own_fsdp.average_gradient_hook: from its gradient to the end
of its hooks), which the backward's "computation" excludes. ``timeline_run`` trains a few steps of
two variants, interleaved (the first step of each warms up), and keeps the last step of each:

* serial: every unit gathers when it starts, and waits for its reduce-scatter as soon as it is
  issued (``WaitingUnit``, a subclass for this measurement only);
* overlapped: PrefetchUnits with prefetch, reduce-scatters in flight as own_fsdp.Unit leaves them.

Then one more backward of the overlapped variant, not timed, counts its backward peak
(own_fsdp_memory.BackwardPeak): with prefetch a second unit's full buffer is filling meanwhile.
Per variant: each unit's intervals, the all-reduces' intervals, and the share of the transfer
time that lies under some unit's computation, the all-reduces' time taken out of it (``hidden``;
``hidden_with_all_reduces`` counts them as computation): all-gathers in forward, all-gathers and reduce-scatters in
backward. The GPU node's version of the same step is own_fsdp_predict.py.
"""
from __future__ import annotations

import threading

from source_code import workload
from source_code.measure import clock
from source_code.sharding.own_fsdp_memory import BackwardPeak
from source_code.sharding.own_fsdp_prefetch import PrefetchUnit


class WaitingUnit(PrefetchUnit):
    """Waits for its reduce-scatter as soon as it has issued it: nothing overlaps in backward."""

    def reduce_grad(self) -> None:
        super().reduce_grad()
        self.reductions.units.remove(self)
        self.finish_reduce()


WAITERS: list[threading.Thread] = []   # on_arrival's threads, joined (join_waiters) before reading stamps


def on_arrival(work, fn) -> None:
    """Call ``fn()`` when ``work`` completes: on its future, or, where the backend has none
    (gloo's reduce-scatter), on a thread that waits for it (kept in WAITERS)."""
    try:
        work.get_future().then(lambda f: fn())
    except RuntimeError:
        waiter = threading.Thread(target=lambda: (work.wait(), fn()), daemon=True)
        waiter.start()
        WAITERS.append(waiter)


def join_waiters() -> None:
    """Wait until every stamp on_arrival's threads owe is in (their works are complete by then)."""
    while WAITERS:
        WAITERS.pop().join()


def record(units, device, phase: dict, model=None) -> list[dict]:
    """Stamp every unit's transfers and computation into the returned list (a dict per event);
    ``phase["now"]``, set by the caller, says "forward" or "backward". With ``model`` (sharded
    before), also each replicated parameter's all-reduce: its gradient hook stamps the start, a
    post-accumulate hook registered after own_fsdp's (hooks run in that order) the end."""
    events = []

    def stamp(kind, unit):                           # unit: a Unit, or a replicated parameter's name
        name = unit if isinstance(unit, str) else unit.name
        events.append({"kind": kind, "unit": name, "phase": phase["now"], "t": clock(device)})

    for u in units:
        def issue(u=u, inner=u.issue):
            fresh = u.pending is None
            if fresh:
                stamp("gather_issue", u)
            inner()
            if fresh:
                on_arrival(u.pending, lambda u=u: stamp("gather_arrived", u))

        def before_backward(u=u, inner=u.before_backward):
            inner()
            stamp("compute", u)                      # gathered: the unit's backward computes now

        def reduce_grad(u=u, inner=u.reduce_grad):
            stamp("done", u)                         # its full gradient is complete
            inner()

        def start_reduce(grad, u=u, inner=u.start_reduce):
            inner(grad)
            stamp("reduce_issue", u)
            on_arrival(u.reducing[0], lambda u=u: stamp("reduce_arrived", u))

        def finish_reduce(u=u, inner=u.finish_reduce):
            stamp("reduce_wait", u)
            inner()
        u.issue, u.before_backward, u.reduce_grad = issue, before_backward, reduce_grad
        u.start_reduce, u.finish_reduce = start_reduce, finish_reduce
        u.module.register_forward_pre_hook(lambda m, a, u=u: stamp("compute", u))   # after unshard
        u.module.register_forward_hook(lambda m, a, o, u=u: stamp("done", u), prepend=True)
    shards = {id(u.shard) for u in units}
    for name, p in (model.named_parameters() if model is not None else ()):
        if id(p) not in shards and p.requires_grad:
            p.register_hook(lambda g, name=name: (stamp("all_reduce_start", name), g)[1])
            p.register_post_accumulate_grad_hook(lambda p, name=name: stamp("all_reduce_end", name))
    return events


def all_reduce_intervals(events: list[dict], t0: float) -> list[tuple[float, float]]:
    """The replicated parameters' all-reduces, (start, end) each, t0 = 0 (one at a time: each
    blocks the backward until it returns)."""
    starts = [e["t"] - t0 for e in events if e["kind"] == "all_reduce_start"]
    ends = [e["t"] - t0 for e in events if e["kind"] == "all_reduce_end"]
    return list(zip(starts, ends))


def _minus(spans, holes):
    """The parts of the intervals ``spans`` outside every interval of ``holes``."""
    for c, d in sorted(holes):
        spans = [piece for a, b in spans
                 for piece in ((a, min(b, c)), (max(a, d), b)) if piece[1] > piece[0]]
    return spans


def intervals(events: list[dict], t0: float) -> dict:
    """{unit: {phase: {"gather" | "compute" | "reduce": (start, end), "wait": t}}}, t0 = 0."""
    at = {}
    for e in events:
        if e["kind"].startswith("all_reduce"):       # a replicated parameter's: all_reduce_intervals
            continue
        at.setdefault((e["unit"], e["phase"]), {}).setdefault(e["kind"], e["t"] - t0)
    out = {}
    for (unit, phase), k in at.items():
        iv = out.setdefault(unit, {}).setdefault(phase, {})
        for name, (a, b) in {"gather": ("gather_issue", "gather_arrived"), "compute": ("compute", "done"),
                             "reduce": ("reduce_issue", "reduce_arrived")}.items():
            if a in k and b in k:
                iv[name] = (k[a], k[b])
        if "reduce_wait" in k:
            iv["wait"] = k["reduce_wait"]
    return out


def hidden_fraction(iv: dict, phase: str, kinds=("gather", "reduce"), blocked=()) -> float:
    """Share of the ``kinds`` transfer time of ``phase`` during which some unit was computing,
    the ``blocked`` intervals (the all-reduces) taken out of the computation."""
    computes = sorted(v[phase]["compute"] for v in iv.values() if "compute" in v.get(phase, {}))
    union = []
    for a, b in computes:                       # computations may overlap: count each instant once
        if union and a <= union[-1][1]:
            union[-1] = (union[-1][0], max(b, union[-1][1]))
        else:
            union.append((a, b))
    computes = _minus(union, blocked)
    total = hidden = 0.0
    for v in iv.values():
        for kind in kinds:
            if kind in v.get(phase, {}):
                a, b = v[phase][kind]
                total += b - a
                hidden += sum(max(0.0, min(b, d) - max(a, c)) for c, d in computes)
    return hidden / total if total else 0.0


def timeline_run(ctx, cfg: dict, args, steps: int = 2) -> dict:
    """Steps of the serial and the overlapped variant (interleaved), from rank 0's clock."""
    import torch
    from source_code.sharding.own_fsdp_prefetch import shard_with_prefetch
    dataset = workload.sort_task(n=512)
    phase, runs = {"now": "forward"}, {}
    for name in ("serial", "overlapped"):
        model = workload.build_model(cfg, args.seed, ctx.device)
        units = (shard_with_prefetch(model, prefetch=False, unit_class=WaitingUnit) if name == "serial"
                 else shard_with_prefetch(model))
        runs[name] = (model, units, record(units, ctx.device, phase, model), torch.optim.AdamW(model.parameters()))
    out = {}
    for step in range(steps):
        x, y = workload.rank_slice(workload.global_batch(dataset, step, args.batch_size, args.seed),
                                   ctx.rank, ctx.world_size)
        for name, (model, units, events, opt) in runs.items():
            events.clear()
            phase["now"] = "forward"
            t0 = clock(ctx.device)
            loss = workload.loss_fn(model, x.to(ctx.device), y.to(ctx.device))
            t1 = clock(ctx.device)
            phase["now"] = "backward"
            loss.backward()
            t2 = clock(ctx.device)
            opt.step()
            opt.zero_grad()
            join_waiters()                            # every arrival stamped before reading them
            iv, reduces = intervals(list(events), t0), all_reduce_intervals(list(events), t0)
            backward = sorted((e for e in events if e["phase"] == "backward"), key=lambda e: e["t"])
            out[name] = {
                "intervals": iv, "forward_ms": 1e3 * (t1 - t0), "backward_ms": 1e3 * (t2 - t1),
                "hidden": {"forward": hidden_fraction(iv, "forward"),
                           "backward": hidden_fraction(iv, "backward", blocked=reduces),
                           "reduce": hidden_fraction(iv, "backward", ("reduce",), blocked=reduces)},
                "hidden_with_all_reduces": {"backward": hidden_fraction(iv, "backward"),
                                            "reduce": hidden_fraction(iv, "backward", ("reduce",))},
                "all_reduces": reduces, "all_reduce_ms": 1e3 * sum(b - a for a, b in reduces),
                "backward_issue_order": [e["unit"] for e in backward if e["kind"] == "gather_issue"],
                "backward_order": [e["unit"] for e in backward if e["kind"] == "done"]}
    out["batch"], out["seq"] = x.shape                # per rank: sequences, tokens in each
    model, _, _, opt = runs["overlapped"]             # one more backward, counted, not timed
    with BackwardPeak(model, opt, model) as peak:
        workload.loss_fn(model, x.to(ctx.device), y.to(ctx.device)).backward()
    out["overlapped"].update(backward_peak=peak.peak, backward_parts=peak.parts, at_units=peak.at_units)
    return out
