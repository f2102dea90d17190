"""Notebook 18's exercise: DiLoCo's outer step.

You write, in the notebook::

    def my_outer_step(global_params, local_params, outer_opt, average):
        ...   # after H inner steps: update the tensors of global_params and local_params in place

``global_params``: the parameters of the last synchronisation (the outer optimizer
``outer_opt`` holds them); ``local_params``: this worker's parameters after its H inner steps;
``average(tensors)``: replaces each tensor by its mean over the workers, in place.

``check_outer_step(fn)`` judges results, not the way they were reached: it runs ``fn`` on
several simulated workers at once (one thread each), each with its own drift, and their
``average`` is a real all-reduce among them (what each worker passes, in the order it passes
it, is averaged with what the others pass in the same call): one flat buffer, one tensor at a
time, the parameters or the pseudo-gradients, all work as they would in a process group.
Over several rounds (so the outer momentum matters) every worker's global and local
parameters are compared with DiLoCo's definition computed here (``_expected``: the mean
pseudo-gradient, one step of SGD with Nesterov momentum as torch defines it), on fixed cases and on cases it draws
(other shapes, worker counts, outer learning rates and momenta) that the notebook never
prints. An answer that reaches the package's own DiLoCo (``local_sgd``'s pieces, ``streaming``,
torchft: an import, a global, a closure) is turned away before it runs: the learner writes the
step with torch alone. It prints one line: correct, not done yet, or the first case that differs with a hint;
``strict`` raises ExerciseFailed instead (the tests use that). The mistakes it recognises are
DiLoCo's definition with one thing changed, compared by their results (no wrong answer is
written out here). The reference solution is in
source_code/solutions/nb18_less_communication.py.
"""
from __future__ import annotations

import inspect
import itertools
import secrets
import threading
import types

import torch

FIXED = [(2, 0.7, 0.9), (4, 0.7, 0.9), (3, 1.0, 0.0)]   # (workers, outer lr, momentum)
DRAWN = 12
ROUNDS = 3
WAIT_S = 10          # a worker waiting this long for the others in ``average``: calls differ


class ExerciseFailed(AssertionError):
    pass


def _case(workers: int, lr: float, momentum: float, g: torch.Generator, shapes):
    start = [torch.randn(s, generator=g) for s in shapes]
    # per round, per worker: how far its H inner steps moved it
    rounds = [[[torch.randn(s, generator=g) * 0.1 for s in shapes] for _ in range(workers)]
              for _ in range(ROUNDS)]
    return workers, lr, momentum, start, rounds


def cases(seed: int) -> list:
    out = []
    for i, (w, lr, mom) in enumerate(FIXED):
        out.append(_case(w, lr, mom, torch.Generator().manual_seed(i), [(3, 4), (5,)]))
    g = torch.Generator().manual_seed(seed)
    for _ in range(DRAWN):
        w = int(torch.randint(2, 9, (1,), generator=g))
        lr = round(float(torch.empty(1).uniform_(0.1, 1.5, generator=g)), 3)
        mom = [0.0, 0.5, 0.9, 0.95][int(torch.randint(4, (1,), generator=g))]
        shapes = [tuple(int(v) for v in torch.randint(1, 7, (int(torch.randint(1, 3, (1,), generator=g)),),
                                                        generator=g)) for _ in range(int(torch.randint(1, 4, (1,), generator=g)))]
        out.append(_case(w, lr, mom, g, shapes))
    return out


class _Group:
    """An all-reduce (mean) among ``n`` threads: the c-th call of every worker is one collective."""

    def __init__(self, n: int):
        self.n, self.slots, self.lock = n, {}, threading.Lock()
        self.barrier = threading.Barrier(n, timeout=WAIT_S)

    def average_for(self, k: int):
        calls = itertools.count()

        def average(tensors):
            tensors, c = list(tensors), next(calls)
            with self.lock:
                self.slots[(c, k)] = [t.detach().clone() for t in tensors]
            self.barrier.wait()
            theirs = [self.slots[(c, j)] for j in range(self.n)]
            if any([x.shape for x in other] != [t.shape for t in tensors] for other in theirs):
                raise ExerciseFailed("the workers passed different tensors to the same call of average")
            with torch.no_grad():
                for i, t in enumerate(tensors):
                    t.copy_(sum(other[i] for other in theirs) / self.n)
            self.barrier.wait()            # everyone has read this call's slots
        return average


def _one_round(step_fn, globs, locs, opts) -> None:
    """Every worker runs ``step_fn`` at once; the first error (if any) is raised here."""
    group, errors = _Group(len(globs)), []

    def worker(k):
        try:
            step_fn(globs[k], locs[k], opts[k], group.average_for(k))
        except BaseException as err:        # noqa: BLE001 - handed to the caller
            errors.append(err)
            group.barrier.abort()            # the others stop waiting for this one
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(len(globs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    real = [e for e in errors if not isinstance(e, threading.BrokenBarrierError)]
    if real:
        raise real[0]
    if errors:
        raise ExerciseFailed("a worker waited for the others in average: every worker must call "
                             "average the same number of times, with the same shapes")


def _simulate(step_fn, workers, lr, momentum, start, rounds):
    """ROUNDS outer steps of every worker with ``step_fn``; per round, per worker: (global, local)."""
    globs = [[t.clone().requires_grad_() for t in start] for _ in range(workers)]   # as a model's are
    locs = [[t.clone().requires_grad_() for t in start] for _ in range(workers)]
    opts = [torch.optim.SGD(g, lr=lr, momentum=momentum, nesterov=momentum > 0) for g in globs]
    seen, tensors = [], [[id(t) for t in g + p] for g, p in zip(globs, locs)]
    for drift in rounds:
        with torch.no_grad():
            for loc, d in zip(locs, drift):
                for p, step in zip(loc, d):
                    p.sub_(step)                          # H inner steps moved this worker
        _one_round(step_fn, globs, locs, opts)
        if [[id(t) for t in g + p] for g, p in zip(globs, locs)] != tensors:
            raise ExerciseFailed("a list now holds a new tensor: update the tensors in place (the model "
                                 "and the outer optimizer hold the old ones, which did not change)")
        seen.append([([t.detach().clone() for t in g], [t.detach().clone() for t in p]) for g, p in zip(globs, locs)])
    return seen


def _expected(workers, lr, momentum, start, rounds):
    """Per round, per worker (global, local) from DiLoCo's definition: the mean over the workers
    of (last synchronisation - where the worker went), one step of torch's SGD on it (momentum
    buffer b = d at the first step, then momentum b + d; the step d + momentum b with Nesterov,
    d without momentum), and every worker continues from the result."""
    glob, buf, seen = [t.clone() for t in start], None, []
    locs = [[t.clone() for t in start] for _ in range(workers)]
    for drift in rounds:
        locs = [[p - step for p, step in zip(loc, d)] for loc, d in zip(locs, drift)]
        mean = [sum(g - loc[i] for loc in locs) / workers for i, g in enumerate(glob)]
        if momentum:
            buf = mean if buf is None else [momentum * b + d for b, d in zip(buf, mean)]
            mean = [d + momentum * b for d, b in zip(mean, buf)]
        glob = [g - lr * d for g, d in zip(glob, mean)]
        locs = [[g.clone() for g in glob] for _ in range(workers)]
        seen.append([(glob, loc) for loc in locs])
    return seen


def _same(a, b) -> bool:
    return len(a) == len(b) and all(x.shape == y.shape and torch.allclose(x, y, atol=1e-5, rtol=1e-5)
                                    for x, y in zip(a, b))


def _same_round(got, want) -> bool:
    return all(_same(g1, g2) and _same(l1, l2) for (g1, l1), (g2, l2) in zip(got, want))


# typical mistakes, recognised by their results: each is DiLoCo's definition with something
# changed (for the tests; the notebook never lists them)
def _alone(workers, lr, momentum, start, rounds):
    """Every worker's outer step on its own change, no average."""
    each = [_expected(1, lr, momentum, start, [[drift[k]] for drift in rounds]) for k in range(workers)]
    return [[each[k][r][0] for k in range(workers)] for r in range(len(rounds))]


MISTAKES = [
    (lambda w, lr, mom, start, rounds: _expected(w, 1.0, 0.0, start, rounds),
     "the new parameters are the workers' average: that is local SGD; in DiLoCo "
     "the averaged change goes to the outer optimizer"),
    (_alone, "your step used this worker's change alone: the other workers' never reached it"),
    (lambda w, lr, mom, start, rounds: _expected(w, -lr, mom, start, rounds),
     "the parameters moved away from where the workers went: which way does a gradient point?"),
]


def _hint(got, case, r) -> str:
    for wrong, hint in MISTAKES:
        if all(_same_round(a, b) for a, b in zip(got[:r + 1], wrong(*case)[:r + 1])):
            return hint
    want = _expected(*case)[r]
    if all(_same(g, w) for (g, _), (w, _) in zip(got[r], want)):
        return "the global parameters are right; where does this worker continue from afterwards?"
    before = case[3] if r == 0 else got[r - 1][0][0]
    if _same(got[r][0][0], before):
        return "the global parameters did not move: did the outer optimizer take a step?"
    return ("compare one round on paper: what is the pseudo-gradient, whose average is it, and "
            "which optimizer turns it into the new parameters?")


PACKAGE = ("source_code.less_communication", "source_code.solutions", "torchft")


def _from_the_package(obj) -> bool:
    name = getattr(obj, "__name__", "") if isinstance(obj, types.ModuleType) else getattr(obj, "__module__", "")
    return isinstance(name, str) and name.startswith(PACKAGE)


def _borrowed(fn) -> list:
    """The names in ``fn``'s code (nested functions included) that reach the workshop's DiLoCo:
    an import of its modules, or a global, closure or default that is one of its objects."""
    fn = inspect.unwrap(fn)                  # torch.no_grad() and other decorators: the body itself
    found, codes = [], [getattr(fn, "__code__", None)]
    if getattr(fn, "__module__", "").startswith("source_code.less_communication"):
        found.append(getattr(fn, "__qualname__", repr(fn)))
    while codes:
        code = codes.pop()
        if code is None:
            continue
        for name in code.co_names:
            if any(part in name for part in ("less_communication", "solutions", "torchft")):
                found.append(name)
            elif name in getattr(fn, "__globals__", {}) and _from_the_package(fn.__globals__[name]):
                found.append(name)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                codes.append(const)
            elif isinstance(const, str) and any(part in const for part in ("less_communication", "solutions")):
                found.append(repr(const))
    cells = [c.cell_contents for c in (getattr(fn, "__closure__", None) or ()) if _filled(c)]
    found += [getattr(o, "__name__", repr(o)) for o in cells + list(getattr(fn, "__defaults__", None) or ())
              if _from_the_package(o)]
    return sorted(set(found))


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def _verdict(fn, seed: int) -> None:
    """Raise ExerciseFailed at the first case and round that differs (NotImplementedError passes)."""
    borrowed = _borrowed(fn)
    if borrowed:
        raise ExerciseFailed("write the outer step with torch alone: your function reaches the workshop's "
                             f"own DiLoCo ({', '.join(borrowed)})")
    for n, case in enumerate(cases(seed)):
        workers, lr, momentum = case[:3]
        where = (f"{'fixed' if n < len(FIXED) else 'drawn'} case: {workers} workers, outer lr {lr:g}, "
                 f"momentum {momentum:g}")
        try:
            got = _simulate(fn, *case)
        except NotImplementedError:
            raise
        except ExerciseFailed as failed:
            raise ExerciseFailed(f"{where}: {failed}") from None
        except Exception as err:         # the learner's bug: one line, not a traceback here
            hint = " (parameters are leaves that require grad: update them under torch.no_grad())" \
                if "leaf Variable" in str(err) else ""
            raise ExerciseFailed(f"{where}: your outer step raised {type(err).__name__}: {err}{hint}") from None
        want = _expected(*case)
        for r, (g, w) in enumerate(zip(got, want)):
            if not _same_round(g, w):
                raise ExerciseFailed(f"{where}, round {r + 1}: " + _hint(got, case, r))


def check_outer_step(fn, strict: bool = False, seed: int | None = None, quiet: bool = False) -> bool | None:
    """One line: correct, not done yet, or the first difference with a hint. Returns the
    verdict only with ``strict`` or ``quiet`` (so that a notebook cell shows the line alone)."""
    seed = secrets.randbits(31) if seed is None else seed
    try:
        _verdict(fn, seed)
    except NotImplementedError:
        if not quiet:
            print("not done yet: replace the TODO (raise NotImplementedError) with your code")
        if strict:
            raise ExerciseFailed("not done yet") from None
        return False if quiet else None
    except ExerciseFailed as failed:
        if not quiet:
            print(f"not yet: {failed}")
        if strict:
            raise
        return False if quiet else None
    if not quiet:
        print(f"correct: every worker's parameters match in all {len(FIXED) + DRAWN} cases x {ROUNDS} rounds, "
              f"{DRAWN} of them drawn just now (other worker counts, shapes, learning rates, momenta)")
    return True if (strict or quiet) else None
