"""Notebook 18's exercise: DiLoCo's outer step.

You write, in the notebook::

    def my_outer_step(global_params, local_params, outer_opt, average):
        ...   # after H inner steps: update global_params and local_params in place

``global_params``: the parameters of the last synchronisation (the outer optimizer
``outer_opt`` holds them); ``local_params``: this worker's parameters after its H inner steps;
``average(tensors)``: replaces each tensor by its mean over the workers, in place.
``check_outer_step(fn)`` plays one worker among several: its ``average`` adds what the other
workers (drawn by the check) would contribute. It compares, over several rounds (so the
outer momentum matters), with ``local_sgd.outer_step`` on fixed cases and on cases it draws
(other shapes, worker counts, outer learning rates and momenta), which the notebook never
prints, and prints one line: correct, not done yet, or the first case that differs with a
hint. ``strict`` raises ExerciseFailed instead (the tests use that). The mistakes it
recognises are for the tests, not for the notebook. The reference solution is in
source_code/solutions/nb18_less_communication.py.
"""
from __future__ import annotations

import secrets

import torch

from source_code.less_communication.local_sgd import outer_step

FIXED = [(2, 0.7, 0.9), (4, 0.7, 0.9), (3, 1.0, 0.0)]   # (workers, outer lr, momentum)
DRAWN = 12
ROUNDS = 3


class ExerciseFailed(AssertionError):
    pass


def _case(workers: int, lr: float, momentum: float, g: torch.Generator, shapes):
    start = [torch.randn(s, generator=g) for s in shapes]
    # per round: this worker's drift and the others' pseudo-gradients
    rounds = [([torch.randn(s, generator=g) * 0.1 for s in shapes],
               [[torch.randn(s, generator=g) * 0.1 for s in shapes] for _ in range(workers - 1)])
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


def _simulate(step_fn, workers, lr, momentum, start, rounds):
    """Run ROUNDS outer steps of one worker with ``step_fn``; return (global, local) each round.

    The other workers ran from the same global parameters and moved by their own drifts;
    ``average`` hands each tensor the mean of what every worker would pass in its place (the
    others' parameters if it is given this worker's parameters, their pseudo-gradients, with
    the same sign, if it is given a pseudo-gradient), as a real all-reduce would."""
    glob = [t.clone() for t in start]
    local = [t.clone() for t in start]
    opt = torch.optim.SGD(glob, lr=lr, momentum=momentum, nesterov=momentum > 0)
    seen = []
    for drift, others in rounds:
        with torch.no_grad():
            for p, d in zip(local, drift):
                p.sub_(d)                                   # H inner steps moved this worker
        before = [t.detach().clone() for t in glob]
        mine = [t.detach().clone() for t in local]

        def average(tensors, others=others, before=before, mine=mine):
            with torch.no_grad():
                for i, t in enumerate(tensors):
                    j = i if i < len(mine) and mine[i].shape == t.shape else None
                    if j is not None and torch.allclose(t, mine[j]):
                        theirs = [before[j] - o[j] for o in others]      # their parameters
                    elif j is not None and torch.allclose(t, mine[j] - before[j]):
                        theirs = [-o[j] for o in others]
                    else:
                        theirs = [o[j] for o in others] if j is not None else [t] * len(others)
                    t.add_(sum(theirs)).div_(workers)

        step_fn(glob, local, opt, average)
        seen.append(([t.detach().clone() for t in glob], [t.detach().clone() for t in local]))
    return seen


def _same(a, b) -> bool:
    return len(a) == len(b) and all(x.shape == y.shape and torch.allclose(x, y, atol=1e-5, rtol=1e-5)
                                    for x, y in zip(a, b))


# typical mistakes, recognised by replaying them (for the tests; the notebook never lists them)
@torch.no_grad()
def _no_average(glob, local, opt, average):
    for g, p in zip(glob, local):
        g.grad = g - p
    opt.step()
    for p, g in zip(local, glob):
        p.copy_(g)


@torch.no_grad()
def _parameter_average(glob, local, opt, average):
    average(local)
    for g, p in zip(glob, local):
        g.copy_(p)


@torch.no_grad()
def _flipped(glob, local, opt, average):
    deltas = [p - g for g, p in zip(glob, local)]
    average(deltas)
    for g, d in zip(glob, deltas):
        g.grad = d
    opt.step()
    for p, g in zip(local, glob):
        p.copy_(g)


@torch.no_grad()
def _no_reset(glob, local, opt, average):
    deltas = [g - p for g, p in zip(glob, local)]
    average(deltas)
    for g, d in zip(glob, deltas):
        g.grad = d
    opt.step()


MISTAKES = [
    (_parameter_average, "the new parameters are the workers' average: that is local SGD; in DiLoCo "
                         "the averaged change goes to the outer optimizer"),
    (_no_average, "your step used this worker's change alone: the other workers' never reached it"),
    (_flipped, "the parameters moved away from where the workers went: which way does a gradient point?"),
    (_no_reset, "the global parameters are right; where does this worker continue from afterwards?"),
]


def _hint(got, case, r) -> str:
    for wrong, hint in MISTAKES:
        if all(_same(a, b) and _same(c, d) for (a, c), (b, d) in zip(got[:r + 1], _simulate(wrong, *case)[:r + 1])):
            return hint
    if _same(got[r][0], case[3] if r == 0 else got[r - 1][0]):
        return "the global parameters did not move: did the outer optimizer take a step?"
    return ("compare one round on paper: what is the pseudo-gradient, whose average is it, and "
            "which optimizer turns it into the new parameters?")


def check_outer_step(fn, strict: bool = False, seed: int | None = None, quiet: bool = False) -> bool:
    seed = secrets.randbits(31) if seed is None else seed
    try:
        all_cases = cases(seed)
        for n, case in enumerate(all_cases):
            workers, lr, momentum = case[:3]
            where = (f"{'fixed' if n < len(FIXED) else 'drawn'} case: {workers} workers, outer lr {lr:g}, "
                     f"momentum {momentum:g}")
            try:
                got = _simulate(fn, *case)
            except NotImplementedError:
                raise
            except Exception as err:         # the learner's bug: one line, not a traceback here
                raise ExerciseFailed(f"{where}: your outer step raised {type(err).__name__}: {err}") from None
            want = _simulate(outer_step, *case)
            for r, ((g_got, l_got), (g_want, l_want)) in enumerate(zip(got, want)):
                if not (_same(g_got, g_want) and _same(l_got, l_want)):
                    raise ExerciseFailed(f"{where}, round {r + 1}: " + _hint(got, case, r))
    except NotImplementedError:
        if not quiet:
            print("not done yet: replace the TODO (raise NotImplementedError) with your code")
        if strict:
            raise ExerciseFailed("not done yet") from None
        return False
    except ExerciseFailed as failed:
        if not quiet:
            print(f"not yet: {failed}")
        if strict:
            raise
        return False
    if not quiet:
        print(f"correct: the outer step matches in all {len(FIXED) + DRAWN} cases x {ROUNDS} rounds, "
              f"{DRAWN} of them drawn just now (other worker counts, shapes, learning rates, momenta)")
    return True
