"""The harness of ``make gpu-smoke``: what a check is, where it runs, one line per check.

A check names the GPUs it needs and the commands it starts (``Run``: torchrun, ``python -m``,
``accelerate launch``, ``processes.spawn`` or a call in this process); ``--list`` prints those
commands and the check's body starts exactly them through ``Env.launch``, so the list never
drifts from what runs. Every line reads ``NAME  SECONDS  VERDICT: DETAIL`` with the verdict

    ok        the entry point ran and the assertions held (where it computed, from its output)
    FAIL      it did not run, or an assertion failed (the exit status of the smoke is then 1)
    skipped   needs 2 gpus / not installed (framework) / needs a GPU (with --device cpu)

``--device cpu`` runs the same commands on CPU processes (gloo), as many as the check would use
GPUs: the command lines are tested on a laptop; what only a GPU can show is skipped.
Imports at module level: torch and the workshop's plumbing only, nothing a bare GPU machine
(its own python3, no Jupyter, no datasets, no internet) lacks.
"""
from __future__ import annotations

import gc
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from source_code.cli import Parser, positive_int
from source_code.processes import ProcessesFailed, rank_lines, torchrun
from source_code.rendezvous import free_port

TMP = "{tmp}"        # in a Run's arguments: this smoke run's temporary directory
NPROC = "{nproc}"    # in an accelerate launch's arguments: the number of processes
PORT = "{port}"      # in an accelerate launch's arguments: a free port
ROOT = "{root}"      # the directory that holds source_code/ (for its data files)
ROOT_DIR = str(Path(__file__).resolve().parents[2])
# a Run's process count when it is not the check's GPU count (resolved by Env.nproc)
EVERY_GPU, ONE_MORE_THAN_GPUS, UP_TO_TWO = "every gpu", "gpus+1", "min(gpus,2)"


class Skip(Exception):
    """A check that cannot run here; the reason is printed after ``skipped: ``."""


def gpus_word(n: int) -> str:
    return f"{n} gpu" if n == 1 else f"{n} gpus"


def visible_gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@dataclass(frozen=True)
class Run:
    """One command of a check. ``how``: torchrun | python | accelerate | spawn | call.

    For torchrun, python and accelerate, ``args`` are the command-line arguments (``{tmp}``
    stands for the temporary directory); for spawn and call, ``args[0]`` names the function
    called in ``module``. ``nproc``: None for the check's GPU count, a number, or one of
    EVERY_GPU, ONE_MORE_THAN_GPUS, UP_TO_TWO. ``launcher``: accelerate launch's own arguments.
    """

    how: str
    module: str
    args: tuple[str, ...] = ()
    nproc: int | str | None = None
    launcher: tuple[str, ...] = ()

    def show(self, default_nproc: int) -> str:
        n = self.nproc if self.nproc is not None else default_nproc
        n = f"<{n}>" if isinstance(n, str) else n
        shown = {TMP: "TMP", ROOT + "/": "", NPROC: str(n), PORT: "PORT"}
        args, launcher = (" ".join(_fill(a, shown) for a in part) for part in (self.args, self.launcher))
        if self.how == "torchrun":
            text = f"torchrun --standalone --nproc-per-node={n} -m {self.module} {args}"
        elif self.how == "python":
            text = f"python -m {self.module} {args}"
        elif self.how == "accelerate":
            text = f"accelerate launch {launcher} -m {self.module} {args}"
        elif self.how == "spawn":
            text = f"processes.spawn x{n}: {self.module} {args}"
        else:
            text = f"in this process: {self.module} {args}"
        return text.rstrip()


def _fill(text: str, values: dict) -> str:
    for key, value in values.items():
        text = text.replace(key, value)
    return text


@dataclass(frozen=True)
class Check:
    """A named check: the GPUs it needs, its commands, and the body that runs and asserts them.

    ``package``: a framework that must be importable (else ``skipped: not installed``);
    ``gpu_only``: why the check means nothing on a CPU (``--device cpu`` skips it with that).
    """

    name: str
    gpus: int
    runs: tuple[Run, ...]
    body: Callable[["Env", "Check"], str]
    package: str = ""
    gpu_only: str = ""

    def line(self) -> str:
        """Its ``--list`` line: name, needs, the commands (``;`` between several)."""
        extra = [f"needs {self.package}"] if self.package else []
        extra += ["GPU only"] if self.gpu_only else []
        runs = " ; ".join(r.show(self.gpus) for r in self.runs)
        tail = f"   [{', '.join(extra)}]" if extra else ""
        return f"{self.name:<17} {gpus_word(self.gpus):<7} {runs}{tail}"


@dataclass
class Env:
    """Where the checks run: ``device`` is "cuda" or "cpu"; ``options`` holds the --mfu-* flags."""

    device: str
    gpus: int
    tmp: Path
    options: dict
    timeout: float = 300

    @property
    def policy(self) -> str:
        """What processes.torchrun/spawn get as device: the policy on a GPU, else the CPU."""
        return "auto" if self.device == "cuda" else "cpu"

    def nproc(self, check: Check, run: Run) -> int:
        n = run.nproc if run.nproc is not None else check.gpus
        gpus = self.gpus if self.device == "cuda" else max(check.gpus, 2)  # CPU processes: as wanted
        return {EVERY_GPU: max(gpus, 1), ONE_MORE_THAN_GPUS: gpus + 1,
                UP_TO_TWO: max(1, min(gpus, 2))}.get(n, n) if isinstance(n, str) else n

    def launch(self, check: Check, index: int = 0) -> str:
        """Start ``check.runs[index]`` as --list shows it; its output (torchrun's banner removed).
        A non-zero exit raises ProcessesFailed with the last lines."""
        run = check.runs[index]
        n = self.nproc(check, run)
        values = {TMP: str(self.tmp), ROOT: ROOT_DIR, NPROC: str(n), PORT: str(free_port())}
        args = [_fill(a, values) for a in run.args]
        if run.how == "torchrun":
            return rank_lines(torchrun(run.module, *args, nproc=n, device=self.policy,
                                       timeout=self.timeout).stdout)
        if run.how == "python":
            cmd = [sys.executable, "-m", run.module, *args]
        elif run.how == "accelerate":
            cmd = [sys.executable, "-m", "accelerate.commands.launch",
                   *(_fill(a, values) for a in run.launcher), "-m", run.module, *args]
        else:
            raise ValueError(f"{check.name}: a {run.how} run is called by its check's body")
        env = {**os.environ, "OMP_NUM_THREADS": "1", "WORKSHOP_DEVICE": self.policy}
        res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=env, timeout=self.timeout)
        if res.returncode != 0:
            tail = "\n".join(res.stdout.splitlines()[-25:])
            raise ProcessesFailed(f"exit status {res.returncode}: {' '.join(cmd[2:])}\n{tail}")
        return res.stdout


# ------------------------------------------------------------------ assertions on output
_WHERE = re.compile(r"(?:\bon |\bdevice[=:] ?'?)(cuda(?::\d+)?|cpu)\b")


def computed_on(out: str, env: Env, module: str) -> str:
    """Where the script says it computed ("cuda:0", "cuda", "cpu"), asserted to be env.device.

    Read from the script's own output: "... on cuda:0", "gloo on cpu", "device=cuda:0". A
    script that prints no device fails here: its GPU run is not proven by what it says."""
    said = _WHERE.findall(out)
    if not said:
        last = out.strip().splitlines()[-1] if out.strip() else "(no output)"
        raise AssertionError(f"{module} ran, but its output does not say where it computed (no "
                             f"'on {env.device}' or 'device={env.device}'): it would have to print "
                             f"its device for this check to prove the GPU path; its last line: {last}")
    mine = [d for d in said if d.split(":")[0] == env.device]
    if not mine:
        raise AssertionError(f"{module} computed on {said[-1]}, not on {env.device}")
    return mine[0]


def line_with(out: str, text: str) -> str:
    """The last line of ``out`` containing ``text`` (stripped); AssertionError if none does."""
    found = [ln.strip() for ln in out.splitlines() if text in ln]
    if not found:
        tail = " | ".join(out.strip().splitlines()[-3:])
        raise AssertionError(f"no line with {text!r} in the output (last lines: {tail})")
    return found[-1]


# ------------------------------------------------------------------ running the checks
def why_skipped(check: Check, env: Env) -> str:
    if env.device == "cuda" and env.gpus < check.gpus:
        return f"needs {gpus_word(check.gpus)}"
    if env.device == "cpu" and check.gpu_only:
        return check.gpu_only
    if check.package and importlib.util.find_spec(check.package) is None:
        return f"not installed ({check.package})"
    return ""


def run_one(check: Check, env: Env) -> tuple[str, str]:
    """(verdict, detail) of one check: ok, FAIL or skipped."""
    reason = why_skipped(check, env)
    if reason:
        return "skipped", reason
    try:
        return "ok", check.body(env, check)
    except Skip as why:
        return "skipped", str(why)
    except Exception as err:  # AssertionError, ProcessesFailed, a timeout...: report, go on
        return "FAIL", " ".join(str(err).split())[-600:]
    finally:
        gc.collect()  # what an in-process check left on the GPU goes back before the next one
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def main(checks: list[Check], argv=None) -> int:
    by_name = {c.name: c for c in checks}
    p = Parser(prog="python -m source_code.gpu_smoke", description=__doc__.splitlines()[0])
    p.add_argument("--list", action="store_true", help="print every check: name, GPUs, commands")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                   help="auto: cuda where a GPU is visible; cpu runs the harness without a GPU")
    p.add_argument("--only", default="", help=f"comma-separated subset of: {', '.join(by_name)}")
    p.add_argument("--timeout", type=positive_int, default=300, help="seconds per command")
    for key in ("dim", "layers", "seq", "batch"):
        p.add_argument(f"--mfu-{key}", type=positive_int, default=None,
                       help=f"the mfu check's TransformerLM {key} (default: sized from free GPU memory)")
    args = p.parse_args(argv)
    only = [c for c in args.only.split(",") if c] or list(by_name)
    unknown = [c for c in only if c not in by_name]
    if unknown:
        p.error(f"unknown check(s) {', '.join(unknown)}; choose from {', '.join(by_name)}")
    if args.list:
        print("\n".join(by_name[c].line() for c in only))
        return 0
    gpus = visible_gpus()
    device = "cpu" if args.device == "cpu" else "cuda"
    where = f"{gpus} x {torch.cuda.get_device_name(0)}" if gpus else "no GPU"
    print(f"gpu-smoke: torch {torch.__version__} (CUDA {torch.version.cuda}, HIP {torch.version.hip}), "
          f"{where}, checks on {device}", flush=True)
    if device == "cuda" and not gpus:
        print("gpu-smoke: no GPU visible (torch.cuda.is_available() is False): every check is "
              "skipped; --device cpu runs the same harness on the CPU", flush=True)
    options = {k: v for k, v in vars(args).items() if k.startswith("mfu_") and v is not None}
    failed = 0
    with tempfile.TemporaryDirectory(prefix="gpu-smoke-") as tmp:
        env = Env(device, gpus, Path(tmp), options, args.timeout)
        for name in only:
            start = time.perf_counter()
            verdict, detail = run_one(by_name[name], env)
            failed += verdict == "FAIL"
            print(f"{name:<17} {time.perf_counter() - start:6.1f}s  {verdict}: {detail}", flush=True)
    print(f"gpu-smoke: {len(only) - failed} of {len(only)} checks did not fail")
    return 1 if failed else 0
