"""When each method pays off: time to a target loss on a link, and the link speed where two swap.

A run's quality comes from training here (its held-out loss at the steps where its workers
agree, ``harness.train``); its time on a link from the link model. To reach a target a method
needs n steps (``steps_to_target``: where its held-out loss curve, linear between evaluations,
first comes down to the target; for local SGD and DiLoCo, whose workers agree only every H
steps, the next synchronisation after that). Its step s sends M_s messages and B_s bytes per
rank: its collectives as the run counted them, or as a larger model would make
them (``at_size``: from that model's parameter shapes, a full all-reduce cut into the buckets DDP
builds, ``ddp_buckets``; PowerSGD's r(n + m) numbers per matrix either packed as its authors' code packs them,
one all-reduce for the uncompressed vectors, one for every matrix's P, one for every Q, after the
backward (``packed``, the default), or as torch's DDP hook sends them, three all-reduces per
bucket, of that bucket's matrices and vectors, hidden behind the backward like DDP's
(``packed=False``); ``terms``). The n steps are the run's first n, each charged what it sent
(PowerSGD's plain warm-up steps at their full size):

    T = n c + sum over its first n steps of (M_s alpha + B_s / beta)

c the compute time of a step (the 6 N T rule for that model, links.py), alpha and beta the
link's latency and bandwidth. DDP (and its communication hooks) all-reduces each bucket while
the backward pass computes the rest (notebook 05): with ``overlap`` a step's collectives cost
only what exceeds the backward's time, ``BACKWARD_SHARE`` of c (4 of the 6 N T), step by step (a packed PowerSGD
step waits for the whole backward: nothing of it is hidden):

    T = n c + sum over its first n steps of max(0, M_s alpha + B_s / beta - BACKWARD_SHARE c)

DiLoCo's synchronisation waits for the H inner steps' result: nothing hides it. ``table`` gives T for every method and link, ``winners`` the
fastest per link (``first_on_every_seed``: the same on every seed, or none). PowerSGD's own
compute (its matrix products and orthogonalisations) is not in c: the model charges it nothing. Two methods a and b take equally long on links of latency alpha where

    beta* = (B_a - B_b) / ((n_b - n_a) c + (M_b - M_a) alpha)         (totals over the n steps)

(``crossover``; with overlap the times are no longer linear in 1/beta and the crossover is
found numerically): above that bandwidth the one with more steps loses, below it the one with
more bytes. None when one of them is at least as fast on every bandwidth.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from source_code.less_communication import compression, links
from source_code.less_communication.harness import spec
from source_code.models import TransformerLM

BACKWARD_SHARE = 4 / 6      # of a step's 6 N T: the backward's 4 N T, the time DDP can hide buckets in
BUCKET_BYTES = 25 * 2 ** 20     # DDP's default bucket_cap_mb=25
FIRST_BUCKET_BYTES = 2 ** 20    # and its first bucket's cap (dist._DEFAULT_FIRST_BUCKET_BYTES)
BIG = {"vocab_size": 32000, "dim": 2048, "n_layers": 24, "n_heads": 16, "max_len": 2048}   # 1.34B


def model_shapes(cfg: dict = BIG) -> list:
    """The parameter shapes of a TransformerLM of ``cfg`` (built on the meta device: no memory)."""
    with torch.device("meta"):
        return [tuple(p.shape) for p in TransformerLM(**cfg).parameters()]


def ddp_buckets(shapes: list, bucket_bytes: int = BUCKET_BYTES) -> list:
    """The buckets DDP builds for fp32 parameters of ``shapes``, as lists of indices into
    ``shapes``, in the order their all-reduces start. torch's own assignment
    (``dist._compute_bucket_assignment_by_size``, as DDP calls it when it rebuilds its buckets
    after the first step) of the parameters in the order their gradients become ready, here the
    reverse of the model's (its backward's order): a parameter is never split, a bucket closes
    once it holds ``bucket_bytes`` or more, and the first one once it holds 1 MB."""
    with torch.device("meta"):
        tensors = [torch.empty(shape) for shape in reversed(shapes)]
    buckets, _ = dist._compute_bucket_assignment_by_size(tensors, [FIRST_BUCKET_BYTES, bucket_bytes])
    return [[len(shapes) - 1 - i for i in bucket] for bucket in buckets]


def powersgd_numbers(shapes: list, rank: int) -> tuple:
    """(vector numbers, P numbers, Q numbers) PowerSGD sends for parameters of ``shapes``:
    vectors (and matrices too small to compress) as they are, r n and r m per n x m matrix."""
    mats = [(shape[0], math.prod(shape[1:])) for shape in shapes if compression.compressible(shape, rank)]
    vectors = sum(math.prod(shape) for shape in shapes) - sum(n * m for n, m in mats)
    return vectors, rank * sum(n for n, _ in mats), rank * sum(m for _, m in mats)


def steps_to_target(run: dict, target: float) -> float | None:
    """Steps the run trained (from its start) until its held-out loss, linear between its
    evaluations, comes down to ``target``, rounded up to the next synchronisation for local SGD
    and DiLoCo (an agreed model exists only every H steps); None if it never does."""
    evals, first = run["evals"], run["first"]
    sp = spec(run["method"])
    every = sp["every"] if sp["kind"] in ("local-sgd", "diloco") else 1
    for (s0, l0), (s1, l1) in zip(evals, evals[1:]):
        if l1 <= target:
            steps = s0 - first + (s1 - s0) * (l0 - target) / (l0 - l1) if l0 > target else s0 - first
            return steps if every == 1 else every * math.ceil(steps / every)
    return None


def at_size(run: dict, shapes: list, bucket_bytes: int = BUCKET_BYTES, packed: bool = True) -> dict:
    """``run`` with the collectives a model of parameter ``shapes`` makes in its steps: a full
    all-reduce (4 bytes a parameter) becomes the big model's, one all-reduce per DDP bucket
    (``ddp_buckets``) for the DDP methods (local SGD's and DiLoCo's synchronisation stays one
    all-reduce); a PowerSGD step sends the vectors, P (r n per n x m matrix) and Q (r m):
    ``packed``, each in one all-reduce (Vogels et al.'s code), marked ``exposed`` (after the
    backward); else three all-reduces per bucket, of that bucket's (torch's hook)."""
    sp = spec(run["method"])
    n_big = sum(math.prod(shape) for shape in shapes)
    buckets = [list(range(len(shapes)))] if sp["local"] else ddp_buckets(shapes, bucket_bytes)
    full = [("all_reduce", 4 * sum(math.prod(shapes[i]) for i in bucket)) for bucket in buckets]
    compressed = []
    if sp["rank"]:
        groups = [shapes] if packed else [[shapes[i] for i in bucket] for bucket in buckets]
        compressed = [("all_reduce", 4 * numbers) for group in groups
                      for numbers in powersgd_numbers(group, sp["rank"])]
    out, exposed = [], []
    for ops in run["ops"]:
        if not ops:
            out.append([])
        elif len(ops) == 1 and ops[0][1] == 4 * run["params"]:
            out.append(full)
        elif compressed:
            out.append(compressed)
        else:
            raise ValueError(f"{run['method']}: a step's collectives {ops} are neither a full all-reduce nor PowerSGD's")
        exposed.append(packed and out[-1] is compressed)
    return {**run, "ops": out, "params": n_big, "exposed": exposed}


def first_steps(values: list, steps: float) -> float:
    """The sum of ``values`` over the first ``steps`` steps (a fraction of the last one)."""
    whole = min(int(steps), len(values))
    if steps > len(values):
        raise ValueError(f"{steps} steps asked of a run of {len(values)}")
    return sum(values[:whole]) + (steps - whole) * (values[whole] if whole < len(values) else 0.0)


def terms(run: dict, steps: float | None, scale: float = 1.0, overlap: bool = False) -> dict | None:
    """{"steps": n, "messages", "sent", "per_step": [(M_s, B_s, hideable)], "overlap"}: the
    messages and bytes of ``run``'s first ``steps`` steps, each step with what it sent
    (``per_step``: for the overlap; a step ``run["exposed"]`` marks is never hidden)."""
    if steps is None:
        return None
    per_step = []
    exposed = run.get("exposed") or [False] * len(run["ops"])
    for ops, shown in zip(run["ops"], exposed):
        messages = sent = 0.0
        for kind, nbytes in ops:
            m, b = links.collective_terms(kind, nbytes * scale, run["world"])
            messages, sent = messages + m, sent + b
        per_step.append((messages, sent, not shown))
    return {"steps": steps, "messages": first_steps([m for m, _, _ in per_step], steps),
            "sent": first_steps([b for _, b, _ in per_step], steps), "per_step": per_step, "overlap": overlap}


def method_terms(run: dict, steps: float | None, shapes: list, packed: bool = True) -> dict | None:
    """``terms`` of ``run`` at the size of ``shapes`` (``at_size``); DDP and torch's hooks overlap
    their buckets with the backward, packed PowerSGD steps and local SGD's and DiLoCo's
    synchronisation do not."""
    return terms(at_size(run, shapes, packed=packed), steps, overlap=not spec(run["method"])["local"])


def verdicts(seed_runs: dict, rivals: dict, at_step, shapes: list, compute_s: float, link_names,
             packed: bool = True) -> tuple:
    """For each seed's runs {method: run} and each pair {reference: rival}: the steps each needs
    to the reference's held-out loss after ``at_step(run)`` of its steps, and that seed's
    ``table``: ({seed: {method: steps or None}}, {seed: table})."""
    needed, tables = {}, {}
    for seed, runs in seed_runs.items():
        needed[seed] = {}
        for reference, rival in rivals.items():
            ref = runs[reference]
            target = dict(ref["evals"])[ref["first"] + at_step(ref)]
            for method in (reference, rival):
                needed[seed][method] = steps_to_target(runs[method], target)
        tables[seed] = table({m: method_terms(runs[m], n, shapes, packed) for m, n in needed[seed].items()},
                             link_names, compute_s)
    return needed, tables


def first_on_every_seed(seed_tables: dict, methods) -> dict:
    """{link: the method of ``methods`` first to the target on every seed's table, or None
    where the seeds disagree}."""
    out = {}
    for name in next(iter(seed_tables.values())):
        first = {winners({name: {m: tab[name][m] for m in methods}})[name] for tab in seed_tables.values()}
        out[name] = first.pop() if len(first) == 1 else None
    return out


def seconds(t: dict | None, link, compute_s: float) -> float | None:
    """T = n c + messages alpha + bytes / beta, less what the backward hides when ``t`` overlaps
    (None: the target was never reached)."""
    if t is None:
        return None
    lk = links.link(link) if isinstance(link, str) else link
    if not t.get("overlap"):
        return t["steps"] * compute_s + t["messages"] * lk.alpha + t["sent"] / lk.beta
    hidden = BACKWARD_SHARE * compute_s
    shown = [max(0.0, m * lk.alpha + b / lk.beta - (hidden if hide else 0.0)) for m, b, hide in t["per_step"]]
    return t["steps"] * compute_s + first_steps(shown, t["steps"])


def table(ts: dict, link_names, compute_s: float) -> dict:
    """{link: {method: seconds or None}} for ``terms`` per method: one compute time for all
    (the same model computes the same steps; a method's own extra compute is left out)."""
    return {name: {m: seconds(t, name, compute_s) for m, t in ts.items()} for name in link_names}


def winners(tab: dict) -> dict:
    """{link: method that reached the target first (None if none did)}."""
    out = {}
    for name, row in tab.items():
        reached = {m: t for m, t in row.items() if t is not None}
        out[name] = min(reached, key=reached.get) if reached else None
    return out


def crossover(a: dict, b: dict, alpha: float, compute_s: float) -> float | None:
    """The bandwidth (bytes/s) at which ``a`` and ``b`` (``terms``) take equally long on links
    of latency ``alpha``; None if one is at least as fast on every bandwidth."""
    if a is None or b is None:
        return None
    if a.get("overlap") or b.get("overlap"):
        return _crossover_numeric(a, b, alpha, compute_s)
    fixed = (b["steps"] - a["steps"]) * compute_s + (b["messages"] - a["messages"]) * alpha
    if fixed == 0 or (a["sent"] - b["sent"]) / fixed <= 0:
        return None
    return (a["sent"] - b["sent"]) / fixed


def _crossover_numeric(a: dict, b: dict, alpha: float, compute_s: float) -> float | None:
    """The fastest bandwidth (bytes/s, between 1 kB/s and 1 PB/s) at which a and b swap: a log
    grid finds the sign change, bisection the point."""
    def diff(beta):
        lk = links.Link("swept", alpha, beta, "")
        return seconds(a, lk, compute_s) - seconds(b, lk, compute_s)
    grid = [10 ** (3 + k / 16) for k in range(16 * 12 + 1)]
    for hi, lo in zip(reversed(grid), reversed(grid[:-1])):
        if (diff(lo) > 0) != (diff(hi) > 0) and diff(lo) != 0 and diff(hi) != 0:
            for _ in range(100):
                mid = math.sqrt(lo * hi)
                lo, hi = (mid, hi) if (diff(mid) > 0) == (diff(lo) > 0) else (lo, mid)
            return math.sqrt(lo * hi)
    return None
