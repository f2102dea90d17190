"""Check function of notebook 12's exercise: find and fix a hang (solution: solutions/nb12_profiling.py).

    from source_code.profiling.exercises import check_global_mean
    check_global_mean(global_mean_loss)     # 2 processes, a 5-second collective timeout

``global_mean_loss(loss_sum, count)`` is called on every rank with that rank's summed loss and
its number of samples, and must return the mean loss over ALL ranks' samples, on every rank.
The function travels to the processes as source text (a function defined in a notebook cell
cannot be pickled), so it must be self-contained: it may use ``torch`` and ``dist``.
The check runs on the CPU with gloo on every machine (``spawn(..., device="cpu")``), as the
hang drill does (``hang.py``'s docstring says why): a collective that a rank skips then raises
after the timeout on every rank, where NCCL's watchdog would abort the process.
"""
from __future__ import annotations

import io
import sys
import inspect
import textwrap

import torch

from source_code.processes import ProcessesFailed, spawn

# (loss_sum, count) of rank 0 and rank 1 at each step; rank 1 has no samples at step 1
CASES = [((12.0, 4), (3.0, 2)), ((5.0, 5), (0.0, 0)), ((2.0, 1), (8.0, 2))]
TIMEOUT_S = 5.0


def expected() -> list[float]:
    return [(a[0] + b[0]) / (a[1] + b[1]) for a, b in CASES]


def _run_on_rank(source: str, name: str) -> list:
    """Runs on each spawned rank: the learner's function at every step of CASES."""
    import torch.distributed as dist
    namespace = {"torch": torch, "dist": dist}
    exec(source, namespace)
    fn, rank, out = namespace[name], dist.get_rank(), []
    for step, per_rank in enumerate(CASES):
        loss_sum, count = per_rank[rank]
        try:
            out.append(float(fn(loss_sum, count)))
        except Exception as exc:
            timed_out = "Timed out" in str(exc) or "timeout" in str(exc).lower()
            raise RuntimeError(f"{'TIMEOUT' if timed_out else 'ERROR'} at step {step} on rank {rank} "
                               f"(count {count}): {str(exc).splitlines()[0][:300]}") from None
    # This rank is through. If the other one timed out, the barrier of the harness's clean-up
    # fails here too ("Connection closed by peer"); the other rank's report says why, so that
    # second traceback would only repeat it: keep it off the learner's screen.
    sys.stderr = io.StringIO()
    return out


def check_global_mean(fn, timeout_s: float = TIMEOUT_S) -> str:
    """Run ``fn`` on 2 processes for the steps of CASES; raise AssertionError with a hint if it
    hangs (caught by the timeout) or returns a wrong mean."""
    try:
        fn(1.0, 1)  # outside any process group: a finished function fails on its collective
    except NotImplementedError:
        raise NotImplementedError("exercise not done yet: fix the function, then run this cell again") from None
    except Exception:
        pass
    source = textwrap.dedent(inspect.getsource(fn))
    try:
        # the process group's timeout is minutes by default: seconds here
        got = spawn(_run_on_rank, 2, source, fn.__name__, device="cpu", timeout=60,
                    collective_timeout_s=timeout_s)
    except ProcessesFailed as err:
        text = str(err)
        if "TIMEOUT" in text:
            raise AssertionError(
                f"hang: a rank waited {timeout_s:g} s in a collective the other rank never joined "
                f"(step 1, where rank 1 has count 0). Hint: every rank must make the same collective "
                "calls in the same order, also a rank with nothing to contribute: it can contribute "
                "zeros") from None
        raise AssertionError(f"the function failed on the processes: {text.splitlines()[-1][:300]}") from None
    want = expected()
    for rank, values in enumerate(got):
        for step, (g, w) in enumerate(zip(values, want)):
            assert abs(g - w) < 1e-9, (
                f"wrong value at step {step} on rank {rank}: {g:.4f}, the mean over all samples is {w:.4f}. "
                "Hint: averaging the ranks' own means weighs a rank with 1 sample like one with 5; "
                "all-reduce the loss sum and the count, then divide")
    msg = f"correct: no hang, and the global mean on both ranks at every step ({', '.join(f'{w:.3f}' for w in want)})"
    print(msg)
    return msg
