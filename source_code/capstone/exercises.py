"""The exercise of notebook 19: a DP x CP training step that leaves the one-process curve.

``handed_step(model, x, y, mesh)`` is one step of a dp x cp job as it is handed over: this
rank's samples and tokens, the global-count loss, backward, the gradient reductions. Trained
from the seed checkpoint beside the matrix (``matrix.run(with_bug=True)["seeded_bug"]``, not a
row of the matrix) its loss leaves the one-process curve. The learner gets that run and a tool:

    report = gradient_report(step)     # one step on a 2 x 2 mesh: per parameter, max |grad - one process|
    show_report(report)                # grouped by kind of parameter (the layers folded)

and writes ``train_step(model, x, y, mesh)`` whose gradients equal one process's.
``check_train_step(train_step)`` prints one line: it runs the step in 4 processes on dp x cp
meshes of every rank (2 x 2, 1 x 4, 4 x 1) and on dp x cp meshes inside a larger job (2 x 1 and
1 x 2, each copied on 2 ranks that hold the same tokens but other weights, as tensor-parallel
ranks hold other shards), on samples the notebook never shows (CHECK_SEED; the report's are
DATA_SEED's), and counts the tokens the ranks' MLPs and head ran on (once each in a dp x cp step:
equal gradients alone do not show that the ranks shared the tokens out rather than each running
them all; the count does not tell a split by sample from a split of the sequence, and a forward
that activation checkpointing runs again in the backward is not counted). A function defined in
a notebook cell cannot be pickled, so its source is sent and
executed there, with the modules, importable objects, plain values (numbers, strings, and
tuples, lists, sets and dicts of them), functools.partial objects and the notebook's own helper
functions its code names.
Reference: source_code/solutions/nb19_capstone.py.
"""
from __future__ import annotations

import functools
import os
import re
import tempfile

import torch
import torch.distributed as dist

from source_code.capstone import seed
from source_code.capstone.cp_model import cp_logits, my_tokens
from source_code.capstone.loss import global_token_count, global_token_loss
from source_code.capstone.portable import portable, reaches, rebuild
from source_code.capstone.runner import Runner, Spec, full_weights, mesh, piece, report
from source_code.context_parallel.comm import Ring
from source_code.mesh.reference import make_optimizer

WORLD = 4
MESHES = ((2, 2, 1), (1, 4, 1), (4, 1, 1), (2, 1, 2), (1, 2, 2))   # (dp, cp, copies) on 4 ranks
REPORT_MESH = (2, 2, 1)
TOL = 1e-6
LOSS_RTOL = 1e-5                    # the returned losses' sum against one process's (fp32 rounding: ~1e-7)
COPY_NOISE = 0.05                   # the weights of copy c > 0: the seed's + 0.05 x N(0, 1), seeded by c
DATA_SEED = 7                       # the report's samples (the handed run's report)
CHECK_SEED = 11                     # the check's: samples the notebook never shows


def handed_step(model, x, y, mesh):
    """One DP x CP training step on this rank; ``mesh`` has the dimensions ("dp", "cp")."""
    dp_group, cp_group = mesh["dp"].get_group(), mesh["cp"].get_group()
    ring = Ring(cp_group)                                           # my samples' other tokens
    xs, ys = piece((x, y), mesh["dp"].get_local_rank(), mesh["dp"].size())   # my samples
    ys = my_tokens(ys, ring)                                        # my tokens of them
    count = global_token_count([ys])                                # the step's tokens
    loss = global_token_loss(cp_logits(model, xs, ring), ys, count)
    loss.backward()
    for name, p in model.named_parameters():
        dist.all_reduce(p.grad, group=dp_group)
        if "attn" in name:
            dist.all_reduce(p.grad, group=cp_group)
    return loss                                                     # this rank's share of the loss


def step_runner(spec: Spec, train_step, dp: int = 2, cp: int = 2) -> Runner:
    """A matrix runner training with ``train_step`` on a (dp, cp) mesh of all the ranks."""
    grid = mesh((dp, cp), ("dp", "cp"))
    model = seed.load_seed(spec.path, dtype=spec.dtype)
    opt = make_optimizer(model.parameters(), spec.lr)

    def step(x, y):
        loss = train_step(model, x, y, grid)
        opt.step()
        opt.zero_grad()
        return report(loss)                                         # the ranks' shares, added
    return Runner(step, lambda: full_weights(model))


def dp_cp_mesh(dp: int, cp: int, copies: int = 1):
    """(a ("dp", "cp") mesh, this rank's copy); with ``copies`` > 1, the dp x cp part of a
    ("copy", "dp", "cp") mesh of all the ranks (``copies`` ranks hold the same samples and
    tokens)."""
    if copies == 1:
        return mesh((dp, cp), ("dp", "cp")), 0
    grid = mesh((copies, dp, cp), ("copy", "dp", "cp"))
    return grid["dp", "cp"], grid["copy"].get_local_rank()


def copy_model(path, copy: int):
    """The seed model with copy ``copy``'s weights (copy 0: the seed's own; others perturbed,
    as tensor-parallel ranks hold other weights beside the same tokens)."""
    model = seed.load_seed(path)
    if copy:
        g = torch.Generator().manual_seed(copy)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(COPY_NOISE * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def one_step_diffs(path, train_step, meshes=MESHES, data_seed: int = DATA_SEED) -> list[dict]:
    """On every rank: one ``train_step`` per (dp, cp, copies) mesh from the seed (this rank's
    copy's weights); per mesh {"dp", "cp", "copies", "diffs": {parameter: max |grad - one
    process with the same weights| over all ranks}, "scale": max |one-process grad|, "factor",
    "tokens": the ranks' MLP and head tokens per token of the batch}."""
    x, y = seed.batches(1, 8, data_seed)[0]
    refs = {}
    out = []
    for dp, cp, copies in meshes:
        grid, copy = dp_cp_mesh(dp, cp, copies)
        if copy not in refs:
            reference = copy_model(path, copy)
            ref_loss = global_token_loss(reference(x), y, int((y != -100).sum()))
            ref_loss.backward()
            refs[copy] = {n: p.grad for n, p in reference.named_parameters()}, ref_loss.item()
        ref, ref_loss = refs[copy]
        model = copy_model(path, copy)
        rows = count_rows(model)
        returned = train_step(model, x, y, grid)
        named = dict(model.named_parameters())
        diffs = torch.tensor([(named[n].grad - r).abs().max().item() if named[n].grad is not None
                              else float("inf") for n, r in ref.items()], dtype=torch.float64)
        dist.all_reduce(diffs, op=dist.ReduceOp.MAX)                # the worst rank's
        scale = torch.tensor([max(r.abs().max().item() for r in ref.values())])
        dist.all_reduce(scale, op=dist.ReduceOp.MAX)
        out.append({"dp": dp, "cp": cp, "copies": copies, "diffs": dict(zip(ref, diffs.tolist())),
                    "scale": scale.item(), "loss_diff": _loss_diff(returned, ref_loss / (dp * cp)),
                    "factor": _factor(named, ref), "tokens": _tokens_run(rows, copies * x.numel())})
    return out


def count_rows(model) -> dict:
    """{module: tokens (rows) its forward calls took in}, counted by hooks on the modules that
    act on each token alone and must run on every token once (the MLPs and the head)."""
    rows = {}
    for name, module in model.named_modules():
        if name == "head" or name.endswith(".mlp"):
            rows[name] = 0
            module.register_forward_hook(functools.partial(_add_rows, rows, name))
    return rows


def _add_rows(rows: dict, name: str, module, args, output) -> None:
    if _in_backward():     # activation checkpointing's recomputation: these tokens ran already
        return
    rows[name] += args[0].numel() // args[0].shape[-1]


def _in_backward() -> bool:
    graph_task = getattr(torch._C, "_current_graph_task_id", None)   # -1 outside autograd's backward
    return graph_task is not None and graph_task() != -1


def _tokens_run(rows: dict, tokens: int) -> float:
    """The most tokens any counted module ran on, over all ranks, per token of the batch (1.0
    where every rank ran only its own tokens; more where ranks ran the same tokens twice)."""
    total = torch.tensor(list(rows.values()), dtype=torch.float64)
    dist.all_reduce(total)
    return total.max().item() / tokens


def _loss_diff(returned, share: float) -> float:
    """|the returns added over all ranks - one process's losses (each copy's) added|, relative
    to the latter (inf where a rank returned no number); ``share``: one process's loss / the
    ranks of one mesh."""
    try:
        mine = float(returned.detach() if isinstance(returned, torch.Tensor) else returned)
    except (TypeError, ValueError, RuntimeError):
        mine = float("inf")
    sums = torch.tensor([mine, share], dtype=torch.float64)
    dist.all_reduce(sums)
    return (abs(sums[0] - sums[1]) / abs(sums[1])).item() if torch.isfinite(sums[0]) else float("inf")


def _factor(named: dict, ref: dict) -> tuple[float, float]:
    """(smallest, largest) over the ranks of the best fit a in grad = a x one-process grad."""
    got = [named[n].grad for n in ref if named[n].grad is not None]
    want = [r for n, r in ref.items() if named[n].grad is not None]
    a = sum((g * r).sum() for g, r in zip(got, want)) / sum((r * r).sum() for r in want)
    lo, hi = torch.tensor([float(a)]), torch.tensor([float(a)])
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    return lo.item(), hi.item()


def kind_of(name: str) -> str:
    """The parameter's kind, its layer folded: "layers.2.mlp.up.weight" -> "layers.*.mlp.up.weight"."""
    return re.sub(r"^layers\.\d+\.", "layers.*.", name)


def show_report(report: dict, tol: float = TOL) -> list[str]:
    """Print one line per kind of parameter: its largest gradient difference on the mesh."""
    by_kind: dict = {}
    for name, diff in report["diffs"].items():
        by_kind[kind_of(name)] = max(by_kind.get(kind_of(name), 0.0), diff)
    lines = [f"one step on a dp x cp = {report['dp']} x {report['cp']} mesh: max |grad - one process| "
             f"(largest one-process gradient {report['scale']:.2g})"]
    lines += [f"  {kind:<26} {diff:9.2e}  {'differs' if diff > tol else 'same'}"
              for kind, diff in by_kind.items()]
    print("\n".join(lines))
    return lines


# ------------------------------------------------------------------ running a notebook's function
def _evaluate(path, functions: list, meshes, data_seed: int) -> list:
    """On every rank: each function -> its per-mesh results, or the one line of its error."""
    results = []
    for fn in functions:
        try:
            results.append(one_step_diffs(path, rebuild(*fn), meshes, data_seed))
        except Exception as err:   # the learner's error, one line
            results.append(f"{type(err).__name__}: {err}".splitlines()[0])
    return results


def run_steps(functions, meshes=MESHES, data_seed: int = CHECK_SEED) -> list:
    """Every function of ``functions`` on every mesh, in ONE set of 4 processes."""
    from source_code.processes import ProcessesFailed, spawn
    sent = [portable(fn) for fn in functions]
    with tempfile.TemporaryDirectory() as tmp:
        path = seed.save_seed(os.path.join(tmp, "seed.pt"))
        try:
            return spawn(_evaluate, WORLD, path, sent, meshes, data_seed, device="cpu", collective_timeout_s=60)[0]
        except ProcessesFailed as err:
            lines = [ln for ln in str(err).splitlines() if ln.strip()]
            return [f"the step broke a process: {lines[-1]}"] * len(functions)


def gradient_report(train_step, dp: int = 2, cp: int = 2) -> dict | str:
    """One ``train_step`` on a dp x cp mesh (4 // (dp x cp) copies of it) of 4 processes, on
    the report's samples, against one process; show_report prints it. (The error's one line,
    if the step raised one.)"""
    result = run_steps([train_step], ((dp, cp, WORLD // (dp * cp)),), DATA_SEED)[0]
    return result if isinstance(result, str) else result[0]


# ------------------------------------------------------------------ the check
def verdict(result, tol: float = TOL) -> tuple[bool, str]:
    """(correct?, one line) from one function's per-mesh results: the meshes of every rank
    first; once those are right, the meshes inside a larger job."""
    if isinstance(result, str):
        return False, f"train_step raised an error on a rank: {result}"
    worst = max(max(m["diffs"].values()) for m in result)
    own = [m for m in result if m["copies"] == 1]
    said = _verdict_own(own, tol)
    if said:
        return False, said
    inner = [m for m in result if m["copies"] > 1 and max(m["diffs"].values()) > tol]
    if inner:
        m = inner[0]
        lo, hi = m["factor"]
        where = (f"right on every mesh of all {WORLD} ranks, wrong on a dp x cp = {m['dp']} x "
                 f"{m['cp']} mesh inside a larger job ({m['copies']} copies of it hold the same "
                 f"tokens and other weights)")
        if hi - lo < 1e-3 and abs(lo - 1) > 1e-3:
            return False, f"{where}: the gradients are {lo:.2g} x one process's there"
        return False, (f"{where}: the gradients there are not one process's times a number, "
                       "they hold gradients of other weights")
    twice = [m for m in result if m["tokens"] > 1]
    if twice:
        m = twice[0]
        return False, (f"every gradient is right, but on the dp x cp = {m['dp']} x {m['cp']} mesh "
                       f"the ranks ran the MLPs and the head on {m['tokens']:g} x the batch's "
                       "tokens: a dp x cp step runs each token on one rank of the mesh")
    if not all(m["loss_diff"] <= LOSS_RTOL for m in result):
        return False, ("every gradient is right, but the returned losses do not add up over the "
                       "ranks to one process's loss: return this rank's loss (its share of the sum "
                       "over the global count)")
    return True, f"correct: every gradient equals one process's on {len(result)} meshes (max |diff| {worst:.1e})"


def _verdict_own(result, tol: float) -> str | None:
    """The line naming what is wrong on the meshes of every rank; None where all are right."""
    wrong = {(m["dp"], m["cp"]): sorted({kind_of(n) for n, d in m["diffs"].items() if d > tol})
             for m in result}
    bad = {k: v for k, v in wrong.items() if v}
    if not bad:
        return None
    kinds = sorted({k for v in bad.values() for k in v})
    right = sorted({kind_of(n) for n in result[0]["diffs"]} - set(kinds))
    if not right:
        named = "the gradients of every parameter"
    elif len(right) <= len(kinds):
        named = f"the gradients of every parameter but {', '.join(right)}"
    else:
        named = f"the gradients of {', '.join(kinds)}"
    if len(bad) == len(result) and all(abs(a * WORLD - 1) < 1e-3 for m in result for a in m["factor"]):
        return ("every gradient is one process's divided by the number of ranks: each rank's "
                "loss already divides by the global count, so add the ranks' parts up "
                "instead of averaging them")
    if len(bad) == len(result):
        return (f"{named} differ from one process on every mesh, even where "
                "only one kind of split is made")
    if all(cp > 1 for _, cp in bad):
        return (f"right where the sequence is not split (cp = 1), wrong where it is: {named}; "
                "a context-parallel rank computed those on its own tokens alone")
    if all(dp > 1 for dp, _ in bad):
        return (f"right where the samples are not split (dp = 1), wrong where they are: {named}; "
                "a data-parallel rank computed those on its own samples alone")
    (dp, cp), _ = next(iter(bad.items()))
    return f"{named} differ from one process on the dp={dp} x cp={cp} mesh"


def diagnose(functions) -> list[tuple[bool, str]]:
    """The verdict of every function of ``functions`` (one set of processes for all)."""
    try:
        results = run_steps(functions)
    except ValueError as err:
        return [(False, str(err))] * len(functions)
    return [verdict(r) for r in results]


# where a finished dp x cp step already lives: the matrix's runners, notebook 13's, the solutions
READY_STEPS = ("source_code.capstone.runners_3d", "source_code.capstone.runners_combo",
               "source_code.capstone.runners_model", "source_code.context_parallel.model_step",
               "source_code.solutions")


def check_train_step(train_step, show: bool = True) -> str:
    """Print (``show``) and return one line: ``correct: ...``, ``not done yet: ...`` or ``not yet: ...``."""
    try:
        source, _, found = portable(train_step)
    except ValueError as err:
        line = f"not yet: {err}"
    else:
        ready = reaches(train_step, found, READY_STEPS)
        if ready:
            line = (f"not yet: your step reaches a finished one ({', '.join(ready)}): write it from the "
                    "handed step, with the pieces the cell imports")
        elif "raise NotImplementedError" in source:
            line = "not done yet: write train_step, then run this cell again"
        else:
            ok, said = diagnose([train_step])[0]
            line = said if ok else f"not yet: {said}"
    if show:
        print(line)
    return line
