"""Exercise of notebook 01: combine per-shard gradients into the gradient of the whole batch.

Every rank of data parallelism computes the gradient of the *mean* loss over its own shard.
``fn(grads, sizes)`` gets those gradients and the shard sizes and must return the gradient of
the mean loss over all examples -- also when the shards are not the same size (a last, shorter
batch; an uneven split). ``check_combine(fn)`` compares it with autograd on the whole batch.

    from source_code.basics.shard_exercise import check_combine
    check_combine(my_function)          # prints what is right or wrong; True when correct
"""
from __future__ import annotations

import torch

from source_code.basics.sgd_theory import gradient, problem_batch, shard_gradients

# (number of shards, shard sizes or None for equal shards): equal first, then uneven
CASES = [(1, None), (2, None), (4, None), (8, None), (2, [200, 56]), (3, [128, 100, 28]),
         (4, [1, 5, 50, 200])]


class ExerciseFailed(AssertionError):
    pass


def check_combine(fn, strict: bool = False, atol: float = 1e-10) -> bool:
    """Run ``fn`` on equal and uneven shards of a 256-example batch (float64) and compare with
    the whole-batch gradient. Prints one line; returns True when every case matches. With
    ``strict`` a wrong answer raises ExerciseFailed (tests use that)."""
    w, x, y = problem_batch(256, seed=0)
    ref = gradient(w, x, y)
    try:
        for n_shards, sizes in CASES:
            grads, sizes = shard_gradients(w, x, y, n_shards, sizes)
            got = fn([g.clone() for g in grads], list(sizes))
            if not isinstance(got, torch.Tensor) or got.shape != ref.shape:
                shape = getattr(got, "shape", type(got).__name__)
                raise ExerciseFailed(f"return one tensor shaped like a gradient {tuple(ref.shape)}, "
                                     f"got {shape}")
            err = (got - ref).abs().max().item()
            if not err <= atol:
                kind = "equal" if len(set(sizes)) == 1 else "uneven"
                raise ExerciseFailed(f"wrong for {n_shards} {kind} shards of sizes {sizes}: max "
                                     f"|yours - whole-batch gradient| = {err:.3g}")
    except NotImplementedError:
        print("not done yet: replace the TODO (raise NotImplementedError) with your code")
        if strict:
            raise
        return False
    except ExerciseFailed as failed:
        print(f"not yet: {failed}")
        if strict:
            raise
        return False
    print(f"correct: matches the whole-batch gradient for all {len(CASES)} cases "
          "(equal and uneven shards)")
    return True
