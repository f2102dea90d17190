"""A pipeline schedule simulator: pure Python, no processes, no torch.

    python -m source_code.pipeline.simulator          # orders and timelines for p=4, m=8

A schedule is, for every stage s of p, the ordered list of its operations: ``("F", i)``
(forward of microbatch i) and ``("B", i)`` (backward of microbatch i). From these orders and
per-operation costs, ``simulate`` computes when each operation starts and ends, assuming:

* a stage does one operation at a time, in its order;
* F(s, i) needs the activation of F(s-1, i); B(s, i) needs F(s, i) done on its own stage and
  the gradient of B(s+1, i) (the last stage starts its backward from its own loss);
* a message takes ``comm`` seconds; sending never blocks (the real runs post non-blocking
  sends), so a stage only ever waits for what it receives;
* between two of its operations a stage spends ``gap`` seconds not computing (posting its
  messages, bookkeeping): idle time that the formula (p - 1) / (m + p - 1) leaves out.

Two more schedules (more_schedules.py, simulated only) use two extensions: an operation
``("F", i, c)`` runs chunk c of a rank that holds v chunks (interleaved 1F1B: chunk c of rank
r is virtual stage c p + r), and a backward split into ``("B", i)``, the input's gradient
(what the previous stage waits for), and ``("W", i)``, the weights' gradient (ZB-H1; W needs
its own B only).

The real runs (``schedules.run_step``) execute the orders of naive, GPipe and 1F1B; their
measured timelines are compared with the simulated ones in notebook 10.
"""
from __future__ import annotations

from dataclasses import dataclass

from source_code.pipeline.more_schedules import interleaved_order, zb_h1_order

SCHEDULES = ("naive", "gpipe", "1f1b")                  # run for real by schedules.run_step
SIMULATED = SCHEDULES + ("interleaved", "zb-h1")        # the simulator knows these too


# --------------------------------------------------------------------------- orders
def gpipe_order(p: int, m: int, s: int) -> list[tuple[str, int]]:
    """GPipe: all m forwards, then all m backwards (the same on every stage)."""
    _check(p, m, s)
    return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]


def one_f_one_b_order(p: int, m: int, s: int) -> list[tuple[str, int]]:
    """1F1B: p-s-1 warm-up forwards, then one forward + one backward, then the cool-down backwards.

    Stage s keeps at most min(p - s, m) microbatches' activations: a backward frees one
    before the next forward stores one.
    """
    _check(p, m, s)
    warmup = min(p - s - 1, m)
    order = [("F", i) for i in range(warmup)]
    for k in range(m - warmup):                 # steady state: one forward, one backward
        order += [("F", warmup + k), ("B", k)]
    order += [("B", i) for i in range(m - warmup, m)]  # cool-down
    return order


def stage_order(schedule: str, p: int, m: int, s: int, v: int = 2) -> list[tuple]:
    """The order of stage s; "naive" is the unsplit batch sent through the stages: GPipe with m=1;
    "interleaved" holds v chunks per rank, "zb-h1" splits the backward (more_schedules.py)."""
    if schedule == "naive":
        if m != 1:
            raise ValueError(f"the naive split has one microbatch (the whole batch), got m={m}")
        return gpipe_order(p, 1, s)
    if schedule == "gpipe":
        return gpipe_order(p, m, s)
    if schedule == "1f1b":
        return one_f_one_b_order(p, m, s)
    if schedule == "interleaved":
        return interleaved_order(p, m, s, v)
    if schedule == "zb-h1":
        return zb_h1_order(p, m, s)
    raise ValueError(f"unknown schedule {schedule!r}; choose one of {', '.join(SIMULATED)}")


def orders(schedule: str, p: int, m: int, v: int = 2) -> list[list[tuple]]:
    return [stage_order(schedule, p, m, s, v) for s in range(p)]


def _check(p: int, m: int, s: int) -> None:
    if p < 1 or m < 1 or not 0 <= s < p:
        raise ValueError(f"need p >= 1, m >= 1 and 0 <= s < p, got p={p}, m={m}, s={s}")


# --------------------------------------------------------------------------- checks on orders
def _op(op) -> tuple[str, int, int]:
    """(kind, microbatch, chunk) of an operation written with or without its chunk."""
    kind, i, *chunk = op
    return str(kind), int(i), int(chunk[0]) if chunk else 0


def validate(orders_: list[list[tuple]], m: int) -> None:
    """Raise ValueError unless every stage runs F0..F(m-1) and B0..B(m-1) once each (per chunk,
    and W0..W(m-1) where the backward is split), in microbatch order, each B after its F and
    each W after its B (messages between two stages are matched in order)."""
    for s, order in enumerate(orders_):
        ops = [_op(op) for op in order]
        kinds = "FBW" if any(k == "W" for k, _, _ in ops) else "FB"
        for c in sorted({c for _, _, c in ops}):
            for kind in kinds:
                seq = [i for k, i, cc in ops if k == kind and cc == c]
                if seq != list(range(m)):
                    where = f" of chunk {c}" if c else ""
                    raise ValueError(f"stage {s}: the {kind} operations{where} are {seq}, expected "
                                     f"{list(range(m))} (each microbatch once, in order)")
            for i in range(m):
                for before, after, why in (("F", "B", "a backward needs its forward"),
                                           ("B", "W", "a weight gradient needs its input gradient")):
                    if after in kinds and ops.index((after, i, c)) < ops.index((before, i, c)):
                        raise ValueError(f"stage {s}: {after}{i} comes before {before}{i} ({why})")


def peak_in_flight(order: list[tuple]) -> int:
    """Largest number of microbatches (chunks: microbatch-chunks) whose forward is done and whose
    backward is not (stored activations); with a split backward, until the W."""
    frees = "W" if any(_op(op)[0] == "W" for op in order) else "B"
    live = peak = 0
    for op in order:
        kind = _op(op)[0]
        live += 1 if kind == "F" else -1 if kind == frees else 0
        peak = max(peak, live)
    return peak


# --------------------------------------------------------------------------- timeline
@dataclass(frozen=True)
class Op:
    stage: int
    kind: str        # "F", "B" (or, split: "B" input gradient, "W" weight gradient)
    mb: int
    start: float
    end: float
    chunk: int = 0   # which of a rank's chunks (interleaved)


class Deadlock(RuntimeError):
    pass


def _per_stage(cost, p: int) -> list[float]:
    return [float(cost)] * p if isinstance(cost, (int, float)) else [float(c) for c in cost]


def simulate(orders_: list[list[tuple]], fwd=1.0, bwd=2.0, comm=0.0, gap=0.0, wgt=0.0,
             durations: dict | None = None) -> list[Op]:
    """Start and end of every operation; ``fwd``/``bwd``/``wgt`` are the costs of one F, B, W
    (one number, or one per stage; a chunk's operation when a rank holds several), ``comm`` the
    time of a message, ``gap`` a stage's idle time between two of its operations.
    ``durations``: {(kind, stage, microbatch): seconds} for single operations, overriding the
    per-stage cost (a measured step replayed operation by operation).

    Raises Deadlock when no stage can proceed (e.g. two stages each waiting for the other).
    """
    p = len(orders_)
    ops_ = [[_op(op) for op in order] for order in orders_]
    v = 1 + max(c for order in ops_ for _, _, c in order)   # chunks per rank
    cost = {"F": _per_stage(fwd, p), "B": _per_stage(bwd, p), "W": _per_stage(wgt, p)}
    done: dict[tuple[str, int, int], float] = {}     # (kind, virtual stage, mb) -> end time
    free = [0.0] * p                                 # when each stage is next idle
    nxt = [0] * p                                    # index of each stage's next operation
    out: list[Op] = []
    while any(nxt[s] < len(ops_[s]) for s in range(p)):
        progressed = False
        for s in range(p):
            while nxt[s] < len(ops_[s]):
                kind, i, c = ops_[s][nxt[s]]
                g = c * p + s                        # virtual stage (looped over the ranks)
                ready = _ready_time(kind, g, i, p * v, done, comm)
                if ready is None:
                    break
                start = max(free[s] + (gap if nxt[s] else 0.0), ready)
                end = start + (durations.get((kind, s, i), cost[kind][s]) if durations else cost[kind][s])
                done[(kind, g, i)] = free[s] = end
                out.append(Op(s, kind, i, start, end, c))
                nxt[s] += 1
                progressed = True
        if not progressed:
            waiting = {s: orders_[s][nxt[s]] for s in range(p) if nxt[s] < len(orders_[s])}
            raise Deadlock(f"deadlock: every stage waits for a message that never comes; next "
                           f"operations (stage: op) {waiting}")
    return sorted(out, key=lambda op: (op.start, op.stage))


def _ready_time(kind, s, i, p, done, comm):
    """When the inputs of operation (kind, s, i) are available, or None if not yet computed
    (s: the virtual stage of p in all; a message between virtual stages takes ``comm``)."""
    if kind == "W":
        return done.get(("B", s, i))
    if kind == "F":
        if s == 0:
            return 0.0
        dep = done.get(("F", s - 1, i))
        return None if dep is None else dep + comm
    own = done.get(("F", s, i))
    if own is None:
        return None
    if s == p - 1:
        return own
    dep = done.get(("B", s + 1, i))
    return None if dep is None else max(own, dep + comm)


def step_time(timeline: list[Op]) -> float:
    return max(op.end for op in timeline) - min(op.start for op in timeline)


def bubble_fraction(timeline) -> float:
    """Idle time / (p x step time): the step runs from the first start to the last end over all
    stages; a stage is busy only while it computes (waiting for a message counts as idle).

    Accepts simulated ``Op``s or measured records with the same fields (dicts or objects)."""
    ops = [op if isinstance(op, Op) else Op(**op) for op in timeline]
    p = len({op.stage for op in ops})
    total = step_time(ops)
    busy = sum(op.end - op.start for op in ops)
    return (p * total - busy) / (p * total)


def bubble_ratio(timeline) -> float:
    """Idle time / busy time over all stages: the bubble relative to the ideal step (with equal
    stages (T - C) / C, C = what one stage computes); = fraction / (1 - fraction)."""
    frac = bubble_fraction(timeline)
    return frac / (1 - frac)


def format_orders(orders_) -> str:
    def name(op):
        k, i, c = _op(op)
        return f"{k}{i}" + "'" * c          # chunk 1: F3', chunk 2: F3'' ...
    return "\n".join(f"stage {s}: " + " ".join(name(op) for op in order)
                     for s, order in enumerate(orders_))


if __name__ == "__main__":
    from source_code.pipeline.formulas import bubble_theory, interleaved_bubble, zb_h1_bubble
    p, m = 4, 8
    for name in ("gpipe", "1f1b"):
        o = orders(name, p, m)
        tl = simulate(o)
        print(f"{name}, p={p}, m={m} (F=1, B=2):\n{format_orders(o)}")
        print(f"  step time {step_time(tl):.0f}, bubble {bubble_fraction(tl):.3f} "
              f"(theory {bubble_theory(p, m):.3f}), peak stored microbatches per stage "
              f"{[peak_in_flight(x) for x in o]}\n")
    o = orders("interleaved", p, m, v=2)
    tl = simulate(o, fwd=1 / 2, bwd=2 / 2)
    print(f"interleaved 1F1B, v=2 chunks per rank (a chunk's F=1/2, B=2/2):\n{format_orders(o)}")
    print(f"  bubble ratio {bubble_ratio(tl):.4f} (theory (p-1)/(v m) = {interleaved_bubble(p, m, 2):.4f})\n")
    o = orders("zb-h1", p, m)
    tl = simulate(o, fwd=1, bwd=1, wgt=1)
    print(f"ZB-H1 (F=1, B=1 input gradient, W=1 weight gradient):\n{format_orders(o)}")
    print(f"  bubble ratio {bubble_ratio(tl):.4f} (theory {zb_h1_bubble(p, m, 1, 1, 1):.4f}), "
          f"peak stored microbatches per stage {[peak_in_flight(x) for x in o]}")
