"""The framework scripts against the plain DDP script: runs, weights, lines of code, a table.

    python -m source_code.frameworks.compare                 # one interleaved round, the table

``split_runs`` reads the output of ``side_by_side`` (every script in turn in one launch, the
notebook's run) back into one result per run.

Every script is started the way users start it (torchrun, 2 processes) and its ``summary:``
line is parsed. ``weights_diff`` compares the weights two runs saved: with the same seed, the
same batches and SGD, Lightning and DeepSpeed ZeRO repeat the plain script's steps, so the
difference is rounding only. Accelerate shards the data its own way (batches.py): other
batches, other weights, a close accuracy; given the plain script's loader (``--batches
sampler``) it repeats the plain steps too. ``code_lines`` counts the lines a user writes: no blank lines, comments or docstrings.
"""
from __future__ import annotations

import ast
import difflib
import inspect
import io
import os
import time
import tokenize

import torch

from source_code import processes
from source_code.training import loop

PLAIN = "source_code.training.ddp"
SCRIPTS = {
    "plain DDP": PLAIN,
    "Lightning": "source_code.frameworks.lightning_train",
    "Accelerate": "source_code.frameworks.accelerate_train",
    "DeepSpeed": "source_code.frameworks.deepspeed_train",
}
# what the user no longer writes, and how each one starts on Slurm (slurm/frameworks_train.slurm)
DOES_FOR_YOU = {
    "plain DDP": "nothing: process group, sampler, DDP wrap, loop, evaluation by hand",
    "Lightning": "process group, DDP/FSDP wrap, loop, zero_grad/backward/step, devices",
    "Accelerate": "device placement, DDP/FSDP wrap, data sharding (you keep the loop)",
    "DeepSpeed": "ZeRO-1/2/3 partitioning of optimizer state, gradients, parameters",
}
SLURM = {
    "plain DDP": "srun + torchrun per node, or srun one task per GPU",
    "Lightning": "srun one task per GPU (SLURMEnvironment), or torchrun",
    "Accelerate": "srun + torchrun per node (or accelerate launch)",
    "DeepSpeed": "srun + torchrun per node (or the deepspeed launcher + hostfile)",
}


def run(name: str, *args, nproc: int = 2, env: dict | None = None) -> dict:
    """Launch one script with torchrun; its summary values plus the launch's wall time."""
    start = time.perf_counter()
    res = processes.torchrun(SCRIPTS.get(name, name), *args, nproc=nproc, env=env)
    out = loop.parse_summary(res.stdout)
    out.update(name=name, wall_s=time.perf_counter() - start, output=res.stdout)
    return out


def split_runs(output: str) -> dict:
    """The output of one ``side_by_side`` launch, cut at rank 0's ``run: LABEL`` and
    ``run_seconds: S`` lines: {label:
    the run's summary values, its ``output`` and its ``wall_s`` (the run's own seconds)}."""
    parts, label = {}, None
    for line in output.splitlines(keepends=True):
        if line.startswith("run: "):
            label = line[5:].strip()
            parts[label] = []
        elif label is not None:
            parts[label].append(line)
            if line.startswith("run_seconds: "):
                label = None          # the run is over: what follows belongs to no run
    runs = {}
    for label, lines in parts.items():
        text = "".join(lines)
        out = loop.parse_summary(text)
        seconds = [ln.split()[1] for ln in lines if ln.startswith("run_seconds: ")]
        out.update(name=label, output=text, wall_s=float(seconds[-1]) if seconds else float("nan"))
        runs[label] = out
    return runs


def interleaved(names, args=(), rounds: int = 1, extra: dict | None = None) -> list[dict]:
    """The scripts one after another, ``rounds`` times (so a busy neighbour slows all alike).

    ``extra`` gives per-name additional flags (e.g. DeepSpeed's --zero-stage)."""
    runs = []
    for _ in range(rounds):
        for name in names:
            runs.append(run(name, *args, *(extra or {}).get(name, ())))
    return runs


def steps_of(result: dict) -> int:
    """Optimizer steps of a run: its summary's ``steps``, or the plain script's epoch lines."""
    if "steps" in result:
        return int(result["steps"])
    return sum(int(ln.split("steps")[1].split()[0]) for ln in result["output"].splitlines()
               if ln.startswith("epoch") and " steps " in ln)


def step_ms(result: dict) -> float:
    """Milliseconds per optimizer step of a run (its loop time / its steps, evaluation included)."""
    return 1000 * result["seconds"] / max(steps_of(result), 1)


def load_weights(path) -> dict:
    """A plain state_dict: a --save-weights file, or the model of the plain script's snapshot."""
    obj = torch.load(path, map_location="cpu", weights_only=False)
    return obj["model"] if isinstance(obj, dict) and "signature" in obj else obj


def weights_diff(path_a, path_b) -> float:
    """Max absolute difference of two saved models' weights (same names required)."""
    a, b = load_weights(path_a), load_weights(path_b)
    if a.keys() != b.keys():
        raise AssertionError(f"different parameter names: {sorted(a.keys() ^ b.keys())[:4]}")
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def parity_run(name: str, steps: int, directory, *args) -> str:
    """Train ``steps`` steps (one epoch) and save the weights; returns the file's path."""
    path = os.path.join(directory, f"{name.replace(' ', '_')}_{'_'.join(args) or 'default'}.pt")
    flag = ["--checkpoint", path] if SCRIPTS.get(name, name) == PLAIN else ["--save-weights", path]
    run(name, "--epochs", "1", "--max-steps", str(steps), *flag, *args)
    return path


def code_lines(source: str) -> int:
    """Lines holding code: blank lines, comments and docstrings do not count."""
    tree = ast.parse(source)
    doc = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(getattr(body[0], "value", None), ast.Constant) \
                and isinstance(body[0].value.value, str):
            doc.update(range(body[0].lineno, body[0].end_lineno + 1))
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENCODING, tokenize.ENDMARKER}
    lines = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in skip:
            lines.update(range(tok.start[0], tok.end[0] + 1))
    return len(lines - doc)


def script_source(name: str) -> str:
    import importlib
    return inspect.getsource(importlib.import_module(SCRIPTS.get(name, name)))


# the functions that hold each script's training (the rest: flags and process start-up)
TRAINING_CODE = {
    "plain DDP": ["train", "source_code.training.loop:train_epoch"],  # its loop lives in loop.py
    "Lightning": ["make_module", "make_trainer", "train"],
    "Accelerate": ["check_world", "train"],
    "DeepSpeed": ["load_config", "skip_shm_comm_op", "train"],
}


def train_source(name: str) -> str:
    """The source of a script's training functions: where the frameworks differ from the plain loop."""
    import importlib
    parts = []
    for fn in TRAINING_CODE[name]:
        where, _, fn = fn.rpartition(":")
        parts.append(inspect.getsource(getattr(importlib.import_module(where or SCRIPTS[name]), fn)))
    return "\n".join(parts)


def loop_diff(name: str, context: int = 0) -> str:
    """Unified diff of the plain script's train() against the framework's training functions."""
    a, b = train_source("plain DDP").splitlines(), train_source(name).splitlines()
    return "\n".join(difflib.unified_diff(a, b, "training/ddp.py", SCRIPTS[name], n=context,
                                           lineterm=""))


def table(rows: list[dict]) -> str:
    """A plain-text table of dicts with the same keys (first row decides the columns)."""
    cols = list(rows[0])
    cells = [[str(r[c]) for c in cols] for r in rows]
    width = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    line = lambda vals: " | ".join(v.ljust(w) for v, w in zip(vals, width))  # noqa: E731
    return "\n".join([line(cols), "-+-".join("-" * w for w in width), *map(line, cells)])


def main() -> int:
    runs = interleaved(list(SCRIPTS), ["--epochs", "2"])
    plain = runs[0]
    rows = [{"framework": r["name"], "user code lines": code_lines(script_source(r["name"])),
             "accuracy": f"{r['accuracy']:.4f}",
             "step ms": f"{step_ms(r):.1f}", "vs plain": f"{step_ms(r) / step_ms(plain):.2f}"}
            for r in runs]
    print(table(rows))
    return 0


if __name__ == "__main__":
    from source_code.errors import run_main   # a LaunchError: its one line, exit status 2
    run_main(main)
