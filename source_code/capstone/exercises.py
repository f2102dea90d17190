"""The exercise of notebook 19: a DP x CP run whose loss leaves the one-process curve.

The seeded bug is ``sync_dp_only``: the gradients are summed over the data-parallel group
only, as a data-parallel code base does before context parallelism is added to it. The
learner writes ``sync_gradients(model, dp_group, cp_group)``, which must turn each rank's
gradients into the one-process gradient of the whole global batch (each rank's loss is its
summed cross-entropy / the GLOBAL number of valid targets).

    check_sync_gradients(sync_gradients)   # prints one line: correct, or what is wrong

The check runs the learner's function on meshes the notebook does not print (dp x cp =
1 x 2 and 2 x 1, other samples), in 2 processes: a function defined in a notebook cell
cannot be pickled, so its source is sent and executed there (only torch and dist imported).
Reference: source_code/solutions/nb19_capstone.py.
"""
from __future__ import annotations

import inspect
import os
import tempfile
import textwrap

import torch
import torch.distributed as dist

from source_code.capstone import seed
from source_code.capstone.cp_model import cp_logits, my_tokens
from source_code.capstone.runner import piece
from source_code.context_parallel.comm import Ring
from source_code.workload import lm_loss

MESHES = ((1, 2), (2, 1))           # (dp, cp) on 2 ranks
WORLD = 2
TOL = 1e-6
DATA_SEED = 7                       # samples the notebook never shows


def sync_dp_only(model, dp_group, cp_group):
    """The seeded bug: gradients summed over the data-parallel group only."""
    for p in model.parameters():
        dist.all_reduce(p.grad, group=dp_group)


def one_step_diffs(path, sync, meshes=MESHES) -> list[dict]:
    """On every rank: one DP x CP step per mesh with ``sync``; this rank's max |grad - one
    process| and max |world x grad - one process| (an average in place of a sum) per mesh."""
    from torch.distributed.device_mesh import init_device_mesh
    world = dist.get_world_size()
    x, y = seed.batches(1, 8, DATA_SEED)[0]
    reference = seed.load_seed(path)
    lm_loss(reference(x), y, seed.n_valid(y)).backward()
    ref = [p.grad for p in reference.parameters()]
    out = []
    for dp, cp in meshes:
        mesh = init_device_mesh("cpu", (dp, cp), mesh_dim_names=("dp", "cp"))
        model = seed.load_seed(path)
        ring = Ring(mesh["cp"].get_group())
        xs, ys = piece((x, y), mesh["dp"].get_local_rank(), dp)
        lm_loss(cp_logits(model, xs, ring), my_tokens(ys, ring), seed.n_valid(y)).backward()
        sync(model, mesh["dp"].get_group(), mesh["cp"].get_group())
        grads = [p.grad for p in model.parameters()]
        out.append({"dp": dp, "cp": cp,
                    "diff": max((g - r).abs().max().item() for g, r in zip(grads, ref)),
                    "averaged": max((g * world - r).abs().max().item() for g, r in zip(grads, ref))})
    return out


def _evaluate(path, sources: list) -> list:
    """On every rank: each (source, name) -> per-mesh diffs, or the error it raised."""
    results = []
    for source, name in sources:
        namespace = {"torch": torch, "dist": dist}
        try:
            exec(compile(source, f"<{name}>", "exec"), namespace)
            results.append(one_step_diffs(path, namespace[name]))
        except Exception as err:   # the learner's error, one line
            results.append(f"{type(err).__name__}: {err}".splitlines()[0])
    worst = [r if isinstance(r, str) else [dict(m) for m in r] for r in results]
    for r in worst:                # every rank's worst numbers, so the verdict covers all ranks
        if not isinstance(r, str):
            for m in r:
                for key in ("diff", "averaged"):
                    t = torch.tensor([m[key]])
                    dist.all_reduce(t, op=dist.ReduceOp.MAX)
                    m[key] = t.item()
    return worst


def verdict(result) -> tuple[bool, str]:
    """(correct?, one line) from one function's per-mesh results."""
    if isinstance(result, str):
        return False, f"sync_gradients raised an error on a rank: {result}"
    bad = [m for m in result if m["diff"] > TOL]
    if not bad:
        return True, (f"correct: the gradients equal one process on {len(result)} meshes "
                      f"(max |diff| {max(m['diff'] for m in result):.1e})")
    if all(m["averaged"] <= 4 * TOL for m in result):
        return False, ("the gradients are the one-process gradient divided by the number of ranks: "
                       "each rank's loss already divides by the global token count, so add the "
                       "ranks' gradients up instead of averaging them")
    where = {(m["dp"] > 1, m["cp"] > 1) for m in bad}
    if len(bad) == len(result):
        return False, ("the gradients differ from one process on every mesh: each rank's "
                       "gradient covers only its own samples and its own tokens")
    if all(cp for _, cp in where) and not any(dp and not cp for dp, cp in where):
        return False, ("right when the sequence is not split (cp = 1), wrong when it is: a "
                       "context-parallel rank's gradient covers only its tokens of each sequence")
    if all(dp for dp, _ in where):
        return False, ("right when the samples are not split (dp = 1), wrong when they are: a "
                       "data-parallel rank's gradient covers only its samples")
    m = bad[0]
    return False, f"the gradients differ from one process by {m['diff']:.2g} on a dp={m['dp']} x cp={m['cp']} mesh"


def _source(fn) -> tuple[str, str]:
    try:
        return textwrap.dedent(inspect.getsource(fn)), fn.__name__
    except (OSError, TypeError):
        raise ValueError("cannot read the source of sync_gradients: define it with `def` in a "
                         "notebook cell or a .py file") from None


def diagnose(functions) -> list[tuple[bool, str]]:
    """The verdict of every function of ``functions``, all run in ONE set of processes."""
    from source_code.processes import ProcessesFailed, spawn
    sources = [_source(fn) for fn in functions]
    with tempfile.TemporaryDirectory() as tmp:
        path = seed.save_seed(os.path.join(tmp, "seed.pt"))
        try:
            results = spawn(_evaluate, WORLD, path, sources, device="cpu", collective_timeout_s=60)[0]
        except ProcessesFailed as err:
            lines = [ln for ln in str(err).splitlines() if ln.strip()]
            return [(False, f"sync_gradients broke a process: {lines[-1]}")] * len(functions)
    return [verdict(r) for r in results]


def check_sync_gradients(sync_gradients, show: bool = True) -> str:
    """Print (``show``) and return one line: ``correct: ...``, ``not done yet: ...`` or ``not yet: ...``."""
    try:
        source, _ = _source(sync_gradients)
    except ValueError as err:
        line = f"not yet: {err}"
    else:
        if "raise NotImplementedError" in source:
            line = "not done yet: write sync_gradients, then run this cell again"
        else:
            ok, said = diagnose([sync_gradients])[0]
            line = said if ok else f"not yet: {said}"
    if show:
        print(line)
    return line
