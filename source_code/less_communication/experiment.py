"""Every run of notebook 18 in one process group: what the notebook and the entry point read.

``experiment(settings)`` runs on every rank (under ``processes.spawn`` or ``train.py`` under
torchrun). It first checks the slept link (checks.py); for the main seed (``settings["seed"]``)
it pretrains the common start, trains every method of ``methods(s)`` from it (harness.py) and
runs the in-flight and bf16 checks; for every other seed of ``settings["seeds"]`` it pretrains
that seed's start and trains the runs whose spread across seeds the notebook prints
(``spread_methods``); torch's PowerSGD hook trains ``TORCH_STEPS`` steps. ``goals_only``
trains only what the entry point's summary line needs.
``progress`` prints a line per run on rank 0 as it ends (the notebook streams them). Rank 0
returns the results as plain values; the other ranks None.

    results["runs"][method]                 the main seed's runs
    results["seeds"][seed][method]          the spread runs, every seed (the main one included)
    results["start"]                        the held-out loss of the common start
    results["start_state"]                  the common start (model, AdamW) as plain values (``unplain``)
    results["check"], ["overlap"], ["bf16"] checks.py
    results["floor"]                        the task's floor (tasks.py)
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from source_code.distributed import print0
from source_code.less_communication import checks, tasks
from source_code.less_communication.harness import pretrain, settings_with, train

# the rank at which the spread runs compare error feedback (beside --rank): on these 48-wide
# matrices rank 8 keeps enough of each gradient for error feedback to track DDP with SGD within
# these steps, and leaves enough out that without it the run falls behind (section 2)
EF_RANK = 8
TORCH_STEPS = 20     # torch's PowerSGD hook: steps trained (ours is compared with it on these)


def methods(s: dict) -> list:
    """The main seed's methods (``goals_only``: what P, D and the gaps need, nothing else)."""
    h, r = s["every"], s["rank"]
    if s["goals_only"]:
        return ["ddp", "ddp-sgd", f"powersgd-r{r}", f"diloco-{h}"]
    ranks = sorted({1, r, 4, EF_RANK})       # the bytes and loss of each, with error feedback
    hooks = (["ddp-sgd", "fp16"] + [f"powersgd-r{k}" for k in ranks] + [f"powersgd-no-ef-r{EF_RANK}"]
             + [f"torch-powersgd-r{r}"])
    local = (["ddp", f"local-sgd-{h}", f"diloco-{h}", f"diloco-{h}-paper"] + [f"diloco-{k}" for k in s["sweep"] if k != h]
             + [f"diloco-{h}-scratch"]
             + [f"streaming-{p}-{b}-{h}" for p, b in (("consecutive", "fp16"), ("strided", "fp16"), ("strided", "e3m0"))])
    return hooks + local


def spread_methods(s: dict) -> list:
    """Trained for every seed: error feedback or not, and DiLoCo against local SGD (its ablation)."""
    h = s["every"]
    return ["ddp-sgd", f"powersgd-r{EF_RANK}", f"powersgd-no-ef-r{EF_RANK}", "ddp", f"local-sgd-{h}", f"diloco-{h}"]


def floors(task: str, seed: int) -> dict:
    """The task's floor: expected, and the true process's loss on the held-out set."""
    return {"task": task, "expected": tasks.expected_floor(task),
            "held_out": tasks.sample_floor(task, tasks.held_out_set(task, seed))}


def _trained(method: str, s: dict, start: dict, seed: int, progress: bool) -> dict:
    t0 = time.perf_counter()
    # torch's hook is compared with ours step by step from the same Q (the notebook) over its
    # first TORCH_STEPS steps only: how far the two drift apart over a whole run is not measured
    steps = min(TORCH_STEPS, s["steps"]) if method.startswith("torch-") else None
    run = train(method, s, start, seed=seed, steps=steps)
    if progress:
        print0(f"  seed {seed}  {method:28s} held-out loss {run['eval']:.4f}  ({time.perf_counter() - t0:.1f} s)")
    return run


def _plain(x):
    """Tensors as (dtype name, shape, values): the results cross processes as plain values."""
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_plain(v) for v in x)
    return ("tensor", str(x.dtype).split(".")[-1], list(x.shape), x.cpu().reshape(-1).tolist()) if torch.is_tensor(x) else x


def unplain(x):
    """``_plain``'s tensors back (the notebook hands the start to torchft's replicas)."""
    if isinstance(x, dict):
        return {k: unplain(v) for k, v in x.items()}
    if isinstance(x, tuple) and len(x) == 4 and x[0] == "tensor":
        return torch.tensor(x[3], dtype=getattr(torch, x[1])).reshape(x[2])
    if isinstance(x, (list, tuple)):
        return type(x)(unplain(v) for v in x)
    return x


def experiment(settings: dict | None = None, progress: bool = True) -> dict | None:
    s = settings_with(**(settings or {}))
    out = {"settings": s, "runs": {}, "seeds": {}, "floor": floors(s["task"], s["seed"])}
    if not s["goals_only"]:
        out["check"] = checks.slow_link_check(s)
    seeds = [s["seed"]] + ([k for k in s["seeds"] if k != s["seed"]] if not s["goals_only"] else [])
    for seed in seeds:
        start = pretrain(s, seed)
        main = seed == s["seed"]
        todo = methods(s) if main else spread_methods(s)
        if progress:
            print0(f"seed {seed}: {len(todo)} runs of {s['steps']} steps from a start pretrained "
                   f"{s['pretrain']} steps")
        runs = {m: _trained(m, s, start, seed, progress) for m in todo}
        out["seeds"][seed] = {m: runs[m] for m in spread_methods(s) if m in runs}
        if main:
            out["runs"] = runs
            out["start"] = runs["ddp"]["evals"][0][1]
            if not s["goals_only"]:
                out["overlap"] = checks.streaming_overlap(s, start)
                out["bf16"] = checks.bf16_on_this_backend(s)
                out["start_state"] = _plain(start)           # torchft's runs start there too
    return out if dist.get_rank() == 0 else None
