"""What FSDP by hand's overlap would hide on a GPU node: the units' step in the alpha-beta model.

    torchrun --standalone --nproc-per-node=4 -m source_code.sharding.own_fsdp_report   # prints it

A transfer of S bytes over N ranks (ring all-gather or reduce-scatter): (N-1) alpha + (N-1)/N S /
beta; all transfers share one link and run one after the other, in the order they are issued.
Computation runs on one stream at ``flops`` FLOP/s, matrix multiplies only, counted per unit kind:

    embedding (tok, pos)  a lookup: no FLOPs forward, a scatter-add backward (none counted)
    block                 2 x P x T for its weights + 4 x T x S x d for attention's scores and
                          weighted values (T tokens, S the sequence, d the width; the causal mask
                          not subtracted, as the planner and PaLM's MFU count)
    head                  2 x P x T
    backward              2 x the forward (the gradients of the inputs and of the weights)

``simulate`` walks one step as own_fsdp.Unit and PrefetchUnit order it. Serial: every transfer
waited for where it is issued (each unit gathers when it starts, each reduce-scatter waited
for at once). Overlapped: the forward issues unit i+1's gather before unit i computes, the
backward the previous unit's as own_fsdp_prefetch chains them (the embeddings on demand), and
each reduce-scatter is waited for only when the next one is issued, the last after the backward.
Exposed: the time the computation waits, each instant booked to the transfer that has the link
then (waiting for a gather queued behind a reduce-scatter is the reduce-scatter's exposed time);
hidden = 1 - exposed / all transfer time.
Bytes as in bf16 mixed precision (own_fsdp_mixed.py): 2 a parameter gathered, 4 reduced.
"""
from __future__ import annotations

# one NVLink node of 4 x A100, as the planner's "a100" cluster: 200 GB/s per GPU inside the node,
# 125 TFLOP/s sustained (about 40 % of 312 bf16); NCCL's per-message latency some microseconds
GPU_NODE = {"alpha_s": 10e-6, "beta_bytes_s": 200e9, "flops": 125e12}
GATHER_BYTES, REDUCE_BYTES = 2, 4          # per parameter: bf16 all-gather, fp32 reduce-scatter


def unit_costs(cfg: dict, batch: int, seq: int) -> list[dict]:
    """Per unit of a TransformerLM config (own_fsdp.default_units, counted on the meta device):
    name, kind, parameters P, forward and backward FLOPs for ``batch`` sequences of ``seq``."""
    import torch
    from source_code.models import TransformerLM
    from source_code.sharding.own_fsdp import REPLICATED, default_units
    with torch.device("meta"):
        model = TransformerLM(**cfg)
    tokens, out = batch * seq, []
    for name, module in default_units(model):
        p = sum(q.numel() for m in module.modules() if not isinstance(m, REPLICATED)
                for q in m.parameters(recurse=False))
        kind = ("embedding" if isinstance(module, torch.nn.Embedding)
                else "block" if hasattr(module, "attn") else "linear")
        fwd = {"embedding": 0, "linear": 2 * p * tokens,
               "block": 2 * p * tokens + 4 * tokens * seq * cfg["dim"]}[kind]
        out.append({"name": name, "kind": kind, "params": p, "fwd_flops": fwd, "bwd_flops": 2 * fwd})
    return out


def transfer_s(nbytes: float, world: int, node: dict) -> float:
    return (world - 1) * node["alpha_s"] + (world - 1) / world * nbytes / node["beta_bytes_s"]


def simulate(units: list[dict], world: int, overlap: bool, node=GPU_NODE) -> dict:
    """One step's times in seconds: forward, backward, step; all transfer time, the exposed part
    ({phase: {unit: s}}) and the hidden fraction; ``units`` from unit_costs, in forward order."""
    from source_code.sharding.own_fsdp_prefetch import backward_chain
    names = [u["name"] for u in units]
    unit_of = {u["name"]: u for u in units}
    gather = {n: transfer_s(GATHER_BYTES * unit_of[n]["params"], world, node) for n in names}
    reduce = {n: transfer_s(REDUCE_BYTES * unit_of[n]["params"], world, node) for n in names}
    state = {"t": 0.0, "link": 0.0}
    on_link = []                                     # (start, end, phase, unit): the link's queue
    exposed = {"forward": {}, "backward": {}, "reduce": {}}

    def send(duration: float, phase: str, name: str) -> float:   # issued now; arrives when through
        start = max(state["link"], state["t"])
        state["link"] = start + duration
        on_link.append((start, state["link"], phase, name))
        return state["link"]

    def wait(until: float) -> None:                  # each waited instant booked to the transfer
        for start, end, phase, name in on_link:      # that has the link then (one at a time)
            part = min(end, until) - max(start, state["t"])
            if part > 0:
                exposed[phase][name] = exposed[phase].get(name, 0.0) + part
        state["t"] = max(state["t"], until)

    arrive = {names[0]: send(gather[names[0]], "forward", names[0])} if overlap else {}
    for i, n in enumerate(names):                    # forward
        wait(arrive.pop(n) if n in arrive else send(gather[n], "forward", n))
        if overlap and i + 1 < len(names):
            arrive[names[i + 1]] = send(gather[names[i + 1]], "forward", names[i + 1])
        state["t"] += unit_of[n]["fwd_flops"] / node["flops"]
    forward_s = state["t"]
    chain, in_flight = backward_chain(names), None
    arrive = {names[-1]: send(gather[names[-1]], "backward", names[-1])} if overlap else {}
    for n in reversed(names):                        # backward
        wait(arrive.pop(n) if n in arrive else send(gather[n], "backward", n))
        if overlap and n in chain:
            arrive[chain[n]] = send(gather[chain[n]], "backward", chain[n])
        state["t"] += unit_of[n]["bwd_flops"] / node["flops"]
        if not overlap:
            wait(send(reduce[n], "reduce", n))
            continue
        if in_flight is not None:
            wait(in_flight)
        in_flight = send(reduce[n], "reduce", n)
    if in_flight is not None:
        wait(in_flight)                              # the last one, once the backward is done
    comm = 2 * sum(gather.values()) + sum(reduce.values())
    hidden = max(0.0, comm - sum(sum(v.values()) for v in exposed.values()))
    return {"forward_s": forward_s, "step_s": state["t"], "backward_s": state["t"] - forward_s,
            "comm_s": comm, "exposed_s": exposed, "hidden_fraction": hidden / comm if comm else 0.0,
            "gather_s": gather, "reduce_s": reduce,
            "compute_s": {n: (unit_of[n]["fwd_flops"] + unit_of[n]["bwd_flops"]) / node["flops"] for n in names}}


def predict(cfg: dict, batch: int, seq: int, world: int, node=GPU_NODE) -> dict:
    """{"serial": simulate(...), "overlap": simulate(...)} for a TransformerLM config, and
    "exposed_forward": the units whose forward all-gather waits for more than half its time."""
    units = unit_costs(cfg, batch, seq)
    out = {k: simulate(units, world, k == "overlap", node) for k in ("serial", "overlap")}
    overlapped = out["overlap"]
    out["exposed_forward"] = [name for name, waited in overlapped["exposed_s"]["forward"].items()
                              if waited > 0.5 * overlapped["gather_s"][name]]
    out["kinds"] = {u["name"]: u["kind"] for u in units}
    return out
