"""Notebook 16's exercise: turn the plain training loop into an Accelerate loop, then check it on
2 real processes (reference solution: source_code/solutions/nb16_frameworks.py).

    from source_code.frameworks.exercises import check_accelerate_loop
    check_accelerate_loop(accelerate_loop)   # your function(accelerator, model, optimizer, loader, epochs)

The function's source is written to a file and run under torchrun by exercise_runner.py (a
function defined in a notebook cell cannot be sent to other processes). What the processes
report decides: equal weights on both ranks (gradients averaged), half of the batches per rank
(data sharded), accelerator.backward called, the optimizer prepared, the model learned.
"""
from __future__ import annotations

import inspect
import json
import os
import re
import tempfile
import textwrap

from source_code import processes

RUNNER = "source_code.frameworks.exercise_runner"
HEADER = "from __future__ import annotations\n\nimport torch\nimport torch.nn.functional as F\n\n"
MIN_ACCURACY = 0.5  # two epochs of the plain script reach ~0.85


def run_loops(fns, nproc: int = 2, epochs: int = 2) -> list[dict]:
    """Run each function on ``nproc`` processes (one launch for all); one report per function."""
    with tempfile.TemporaryDirectory() as tmp:
        specs = []
        for i, fn in enumerate(fns):
            path = os.path.join(tmp, f"loop_{i}.py")
            with open(path, "w") as f:
                f.write(HEADER + textwrap.dedent(inspect.getsource(fn)))
            specs.append(f"{path}:{fn.__name__}")
        res = processes.torchrun(RUNNER, "--epochs", epochs, *specs, nproc=nproc, device="cpu")
    reports = [json.loads(ln.split("exercise: ", 1)[1]) for ln in res.stdout.splitlines()
               if ln.startswith("exercise: ")]
    assert len(reports) == len(fns), f"expected {len(fns)} reports:\n{res.stdout[-2000:]}"
    return reports


def judge(r: dict, notebook_names=frozenset()) -> str:
    """The verdict on one report: a sentence starting with 'correct', or an AssertionError.
    ``notebook_names``: the names the learner's notebook defines (a NameError for one of them
    means the function relied on the notebook, which the processes that run it do not have)."""
    if r["todo"]:
        raise NotImplementedError("exercise not done yet: fill in the TODOs, then run this cell again")
    assert not (r["own_accelerators"] and not (r["models_prepared"] and r["backward_calls"])), (
        "your function made an Accelerator of its own and trained with it: train with the one it "
        "is given (the check reads what that one prepared and how often its backward ran)")
    missing = re.match(r"NameError: name '(\w+)' is not defined", r["error"])
    assert not (missing and missing[1] in notebook_names), (
        f"your function raised {r['error']}: `{missing and missing[1]}` is defined in the notebook, "
        "but the function runs from its own source in other processes, where only torch, F "
        "(torch.nn.functional) and its arguments are defined: import or define it inside the function")
    assert not missing, f"your function raised {r['error']}: a name defined nowhere (a typo?)"
    assert not r["error"], (f"your function raised {r['error']}. Hint: accelerator.prepare returns "
                            "the prepared objects in the order you passed them")
    assert r["models_prepared"] and r["weight_diff"] <= 1e-6, (
        f"the processes ended with different weights (max diff {r['weight_diff']:.2e}) or the model "
        "was never prepared: nothing averaged the gradients. Hint: pass the model to "
        "accelerator.prepare and train the object it returns")
    assert r["steps"] * r["world_size"] <= r["batches"] + r["world_size"], (
        f"each process took {r['steps']} steps over {r['epochs']} epochs, as many as the whole "
        f"loader has batches ({r['batches']}): every process saw all the data. Hint: prepare "
        "the loader too, so each process gets its share of the batches")
    assert r["steps"] * r["world_size"] >= r["batches"], (
        f"each process took {r['steps']} steps over {r['epochs']} epochs, fewer than its share of "
        f"the loader's {r['batches']} batches. Hint: every epoch, every batch of the prepared loader")
    assert r["optimizers_prepared"], (
        "the optimizer was not prepared. Hint: prepare it with the model: with mixed precision, "
        "FSDP or DeepSpeed the prepared optimizer is the one that steps the wrapped parameters")
    assert r["prepared_steps"] > 0, (
        "the optimizer was prepared, but the loop stepped the original one: step the object "
        "prepare returned (with mixed precision, FSDP or DeepSpeed it is the one that steps the "
        "wrapped parameters)")
    assert r["backward_calls"] > 0, (
        "loss.backward() was called, not accelerator.backward(loss). It gives the same numbers "
        "here, but loss scaling (fp16), gradient accumulation and DeepSpeed need the "
        "accelerator's backward")
    assert r["accuracy"] >= MIN_ACCURACY, (
        f"the model reached only {r['accuracy']:.2f} held-out accuracy. Hint: zero the gradients, "
        "then forward, backward, step, for every batch")
    return (f"correct: {r['world_size']} processes with equal weights (max diff "
            f"{r['weight_diff']:.1e}), {r['steps']} steps each (the whole loader: {r['batches']} batches "
            f"in {r['epochs']} epochs), held-out accuracy {r['accuracy']:.3f}")


def check_accelerate_loop(fn) -> str:
    """Run ``fn`` on 2 processes under torchrun and judge it; prints and returns the verdict."""
    try:  # an unfinished function stops at its TODO at once: no processes needed to say so
        fn(None, None, None, None, 0)
    except NotImplementedError:
        raise NotImplementedError("exercise not done yet: fill in the TODOs, then run this cell again") from None
    except Exception:  # a real attempt trips over the None arguments: run it for real
        pass
    msg = judge(run_loops([fn])[0], notebook_names=set(fn.__globals__))
    print(msg)
    return msg
