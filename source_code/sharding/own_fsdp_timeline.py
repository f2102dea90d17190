"""The prefetch timeline of FSDP by hand, from measured timestamps, and its alpha-beta prediction.

    torchrun --standalone --nproc-per-node=4 -m source_code.sharding.own_fsdp_report   # runs it

``record(units, device)`` wraps each PrefetchUnit's methods (the lesson code stays as it is)
and stamps with measure.clock: when each all-gather is issued, when its bytes have arrived
(the Work's future completes, on gloo's thread), when the unit starts and ends computing.
``timeline_run`` trains a few steps with prefetch off and on, interleaved, and keeps the last
forward of each: the figure's bars and the overlap, i.e. the part of each transfer that lies
under another unit's computation. ``predict`` puts the same units into the alpha-beta model of a
GPU node (ring all-gather: (N-1) messages in a row, (N-1)/N of the bytes through each link;
forward compute 2 FLOPs per parameter per token).
"""
from __future__ import annotations

from source_code import workload
from source_code.measure import clock

# one NVLink node (4 x A100, as the planner's "a100" cluster): 200 GB/s per GPU inside the node,
# 125 TFLOP/s sustained; NCCL's per-message latency inside a node is some microseconds
GPU_NODE = {"alpha_s": 10e-6, "beta_bytes_s": 200e9, "flops": 125e12}


def record(units, device) -> list[dict]:
    """Stamp every unit's gather and forward into the returned list (one dict per event)."""
    events = []

    def stamp(kind, unit):
        events.append({"kind": kind, "unit": unit.name, "t": clock(device)})

    for u in units:
        issue = u.issue

        def timed_issue(u=u, issue=issue):
            fresh = u.pending is None
            if fresh:
                stamp("issue", u)
            issue()
            if fresh:
                u.pending.get_future().then(lambda f, u=u: stamp("arrived", u))
        u.issue = timed_issue
        u.module.register_forward_pre_hook(lambda m, a, u=u: stamp("compute", u))   # after unshard
        u.module.register_forward_hook(lambda m, a, o, u=u: stamp("done", u), prepend=True)
    return events


def intervals(events: list[dict]) -> dict:
    """{unit: {"transfer": (issue, arrived), "compute": (start, end)}} of one forward, t0 = 0."""
    t0 = min(e["t"] for e in events)
    out = {}
    for e in sorted(events, key=lambda e: e["t"]):     # the first of each kind: the forward's
        out.setdefault(e["unit"], {}).setdefault(e["kind"], e["t"] - t0)
    return {u: {"transfer": (v["issue"], v["arrived"]), "compute": (v["compute"], v["done"])}
            for u, v in out.items()}


def hidden_fraction(iv: dict) -> float:
    """Share of all transfer time during which some unit was computing."""
    computes = [v["compute"] for v in iv.values()]
    total = hidden = 0.0
    for v in iv.values():
        a, b = v["transfer"]
        total += b - a
        hidden += sum(max(0.0, min(b, d) - max(a, c)) for c, d in computes)
    return hidden / total if total else 0.0


def timeline_run(ctx, cfg: dict, args, steps: int = 3) -> dict:
    """Forward timelines with prefetch off and on (interleaved steps), from rank 0's clock."""
    import torch
    from source_code.sharding.own_fsdp_prefetch import shard_with_prefetch
    dataset = workload.sort_task(n=512)
    runs = {}
    for prefetch in (False, True):
        model = workload.build_model(cfg, args.seed, ctx.device)
        units = shard_with_prefetch(model, prefetch=prefetch)
        runs[prefetch] = (model, units, record(units, ctx.device), torch.optim.AdamW(model.parameters()))
    out = {}
    for step in range(steps):
        x, y = workload.rank_slice(workload.global_batch(dataset, step, args.batch_size, args.seed),
                                   ctx.rank, ctx.world_size)
        for prefetch, (model, units, events, opt) in runs.items():
            events.clear()
            start = clock(ctx.device)
            loss = workload.loss_fn(model, x.to(ctx.device), y.to(ctx.device))
            forward_s = clock(ctx.device) - start
            end = max(e["t"] for e in events if e["kind"] == "done")
            loss.backward()
            opt.step()
            opt.zero_grad()
            iv = intervals(list(events))
            out["prefetch" if prefetch else "none"] = {
                "intervals": iv, "forward_ms": 1e3 * forward_s, "hidden_fraction": hidden_fraction(iv),
                "backward_issue_order": [e["unit"] for e in sorted(events, key=lambda e: e["t"])
                                         if e["kind"] == "issue" and e["t"] > end]}
    out["tokens"] = x.numel()                     # tokens per rank per step
    out["unit_bytes"] = {u.name: u.full.numel() * u.full.element_size() for u in runs[True][1]}
    out["unit_params"] = {u.name: u.numel for u in runs[True][1]}
    return out


def predict(unit_bytes: dict, unit_params: dict, tokens: int, world: int, node=GPU_NODE) -> dict:
    """Forward time of the units on a GPU node without and with prefetch (alpha-beta model)."""
    names = list(unit_bytes)
    gather = [(world - 1) * node["alpha_s"] + (world - 1) / world * unit_bytes[u] / node["beta_bytes_s"]
              for u in names]
    compute = [2 * unit_params[u] * tokens / node["flops"] for u in names]
    serial = sum(gather) + sum(compute)
    # prefetch: unit i+1's gather runs under unit i's compute; the first one is exposed
    overlapped = gather[0] + sum(max(c, g) for c, g in zip(compute, gather[1:] + [0.0]))
    hidden = sum(min(c, g) for c, g in zip(compute, gather[1:]))
    # one rank gathers nothing: nothing to hide
    return {"serial_s": serial, "prefetch_s": overlapped,
            "hidden_fraction": hidden / sum(gather) if sum(gather) else 0.0}


def unit_sizes(cfg: dict, world: int) -> tuple[dict, dict]:
    """({unit: full-buffer bytes}, {unit: parameters}) of a TransformerLM config, fp32, counted
    on the meta device (no memory): what own_fsdp's units of that model gather."""
    import torch
    from source_code.models import TransformerLM
    from source_code.sharding.own_fsdp import REPLICATED, default_units
    with torch.device("meta"):
        model = TransformerLM(**cfg)
    params = {name: sum(p.numel() for m in module.modules() if not isinstance(m, REPLICATED)
                        for p in m.parameters(recurse=False))
              for name, module in default_units(model)}
    return {k: -(-n // world) * world * 4 for k, n in params.items()}, params
