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

The real runs (``schedules.run_step``) execute exactly these orders; their measured timelines
are compared with the simulated ones in notebook 09.
"""
from __future__ import annotations

from dataclasses import dataclass

SCHEDULES = ("naive", "gpipe", "1f1b")


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


def stage_order(schedule: str, p: int, m: int, s: int) -> list[tuple[str, int]]:
    """The order of stage s; "naive" is the unsplit batch sent through the stages: GPipe with m=1."""
    if schedule == "naive":
        if m != 1:
            raise ValueError(f"the naive split has one microbatch (the whole batch), got m={m}")
        return gpipe_order(p, 1, s)
    if schedule == "gpipe":
        return gpipe_order(p, m, s)
    if schedule == "1f1b":
        return one_f_one_b_order(p, m, s)
    raise ValueError(f"unknown schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")


def orders(schedule: str, p: int, m: int) -> list[list[tuple[str, int]]]:
    return [stage_order(schedule, p, m, s) for s in range(p)]


def _check(p: int, m: int, s: int) -> None:
    if p < 1 or m < 1 or not 0 <= s < p:
        raise ValueError(f"need p >= 1, m >= 1 and 0 <= s < p, got p={p}, m={m}, s={s}")


# --------------------------------------------------------------------------- checks on orders
def validate(orders_: list[list[tuple[str, int]]], m: int) -> None:
    """Raise ValueError unless every stage runs F0..F(m-1) and B0..B(m-1) once each, in
    microbatch order, each B after its F (messages between two stages are matched in order)."""
    for s, order in enumerate(orders_):
        ops = [tuple(op) for op in order]
        for kind in "FB":
            seq = [i for k, i in ops if k == kind]
            if seq != list(range(m)):
                raise ValueError(f"stage {s}: the {kind} operations are {seq}, expected "
                                 f"{list(range(m))} (each microbatch once, in order)")
        for i in range(m):
            if ops.index(("B", i)) < ops.index(("F", i)):
                raise ValueError(f"stage {s}: B{i} comes before F{i} (a backward needs its forward)")


def peak_in_flight(order: list[tuple[str, int]]) -> int:
    """Largest number of microbatches whose forward is done and backward is not (stored activations)."""
    live = peak = 0
    for kind, _ in order:
        live += 1 if kind == "F" else -1
        peak = max(peak, live)
    return peak


# --------------------------------------------------------------------------- timeline
@dataclass(frozen=True)
class Op:
    stage: int
    kind: str        # "F" or "B"
    mb: int
    start: float
    end: float


class Deadlock(RuntimeError):
    pass


def _per_stage(cost, p: int) -> list[float]:
    return [float(cost)] * p if isinstance(cost, (int, float)) else [float(c) for c in cost]


def simulate(orders_: list[list[tuple[str, int]]], fwd=1.0, bwd=2.0, comm=0.0, gap=0.0) -> list[Op]:
    """Start and end of every operation; ``fwd``/``bwd`` are costs (one number, or one per stage),
    ``comm`` the time of a message, ``gap`` a stage's idle time between two of its operations.

    Raises Deadlock when no stage can proceed (e.g. two stages each waiting for the other).
    """
    p = len(orders_)
    fwd, bwd = _per_stage(fwd, p), _per_stage(bwd, p)
    done: dict[tuple[str, int, int], float] = {}     # (kind, stage, mb) -> end time
    free = [0.0] * p                                 # when each stage is next idle
    nxt = [0] * p                                    # index of each stage's next operation
    out: list[Op] = []
    while any(nxt[s] < len(orders_[s]) for s in range(p)):
        progressed = False
        for s in range(p):
            while nxt[s] < len(orders_[s]):
                kind, i = orders_[s][nxt[s]]
                ready = _ready_time(kind, s, i, p, done, comm)
                if ready is None:
                    break
                start = max(free[s] + (gap if nxt[s] else 0.0), ready)
                end = start + (fwd[s] if kind == "F" else bwd[s])
                done[(kind, s, i)] = free[s] = end
                out.append(Op(s, kind, i, start, end))
                nxt[s] += 1
                progressed = True
        if not progressed:
            waiting = {s: orders_[s][nxt[s]] for s in range(p) if nxt[s] < len(orders_[s])}
            raise Deadlock(f"deadlock: every stage waits for a message that never comes; next "
                           f"operations (stage: op) {waiting}")
    return sorted(out, key=lambda op: (op.start, op.stage))


def _ready_time(kind, s, i, p, done, comm):
    """When the inputs of operation (kind, s, i) are available, or None if not yet computed."""
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


def format_orders(orders_) -> str:
    return "\n".join(f"stage {s}: " + " ".join(f"{k}{i}" for k, i in order)
                     for s, order in enumerate(orders_))


if __name__ == "__main__":
    from source_code.pipeline.formulas import bubble_theory
    p, m = 4, 8
    for name in ("gpipe", "1f1b"):
        o = orders(name, p, m)
        tl = simulate(o)
        print(f"{name}, p={p}, m={m} (F=1, B=2):\n{format_orders(o)}")
        print(f"  step time {step_time(tl):.0f}, bubble {bubble_fraction(tl):.3f} "
              f"(theory {bubble_theory(p, m):.3f}), peak stored microbatches per stage "
              f"{[peak_in_flight(x) for x in o]}\n")
