"""Which entry points run on this torch: one row each, ok / refused (with its one line) / FAIL / hangs.

    python -m source_code.torch_support                       # with the torch of this environment
    make torch-check TORCH=2.6.0                              # a side environment with torch 2.6.0
    python -m source_code.torch_support --only 09,10 --timeout 120

The clusters' PyTorch modules and containers ship torch 2.6-2.11 while the workshop pins 2.14.1:
this runs each notebook's entry points (the scripts its cells start, at small sizes) under the
torch at hand and prints a markdown table, the README's support table being made of such runs.
A notebook is as supported as the entry points it runs. Lightning, Accelerate and DeepSpeed
rows need those packages (a row says "not installed" otherwise).
"""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from source_code.cli import Parser, positive_float

T = "torchrun"  # started as torchrun --standalone --nproc-per-node=N -m MODULE ARGS
P = "python"    # started as python -m MODULE ARGS
# (notebooks, launcher, processes, module, arguments); TMP is a fresh temporary folder
ENTRY_POINTS = [
    ("00", T, 2, "source_code.basics.ranks", ""),
    ("00", T, 2, "source_code.basics.pingpong", "--sizes 8,65536 --iters 3"),
    ("02 03", P, 1, "source_code.sync.harness", ""),
    ("03", P, 1, "source_code.sync.allreduce_benchmark", "--world-size 2 --max-size 65536 --budget 2"),
    ("04", P, 1, "source_code.training.dataparallel", "--epochs 1 --max-steps 5"),
    ("05", T, 2, "source_code.training.ddp", "--epochs 1 --max-steps 5"),
    ("05", T, 2, "source_code.parity", ""),
    ("05", T, 2, "source_code.ddp_internals.compare", "--steps 6 --warmup 2"),
    ("05", T, 2, "source_code.ddp_internals.no_sync", "--k 2"),
    ("05", T, 3, "source_code.training.evaluation", "--samples 60 --epochs 1"),
    ("06", T, 2, "source_code.launch.sync_check", ""),
    ("06", P, 1, "source_code.launch.node_layouts", ""),
    ("06", P, 1, "source_code.training.loader_workers", "--epochs 1"),
    ("15", T, 2, "source_code.profiling.hang", "--timeout 5 --trace-dir TMP/hang"),  # see EXPECT
    ("07", T, 2, "source_code.training.ddp_fault_tolerant", "--epochs 2 --checkpoint TMP/snap.pt --snapshot-every 5"),
    ("08", P, 1, "source_code.memory.report", "--repeats 2"),
    ("09", T, 2, "source_code.sharding.parity", "--steps 2"),
    ("09", T, 2, "source_code.sharding.train", "--epochs 1 --max-steps 3 --checkpoint TMP/dcp"),
    ("09", T, 4, "source_code.sharding.fsdp_demo", ""),
    ("09", P, 1, "source_code.sharding.memory_report", "--world-sizes 1 2"),
    ("09", T, 4, "source_code.sharding.own_fsdp_report", ""),
    ("10", T, 2, "source_code.pipeline.train", "--schedule 1f1b --epochs 1 --max-steps 4"),
    ("10", T, 2, "source_code.pipeline.train", "--schedule lib-gpipe --epochs 1 --max-steps 4"),
    ("10", T, 2, "source_code.pipeline.train", "--schedule lib-1f1b --epochs 1 --max-steps 4"),
    ("10", T, 2, "source_code.pipeline.train", "--schedule lib-interleaved-1f1b --epochs 1 --max-steps 4"),
    ("10", T, 2, "source_code.pipeline.compare", "--steps 2 --warmup 1"),
    ("11", T, 2, "source_code.tensor_parallel.train", "--impl own --sequence-parallel --epochs 1 --max-steps 4"),
    ("11", T, 2, "source_code.tensor_parallel.train", "--impl dtensor --sequence-parallel --epochs 1 --max-steps 4"),
    ("11", T, 2, "source_code.tensor_parallel.compare", "--steps 3"),
    ("12", T, 4, "source_code.mesh.train_2d", "--tp 2 --steps 3"),
    ("12", P, 1, "source_code.mesh.pipeline3d", ""),
    ("12", P, 1, "source_code.planner.check", ""),
    ("13", P, 1, "source_code.context_parallel.compare", ""),
    ("14", P, 1, "source_code.expert_parallel.compare", ""),
    ("14", T, 2, "source_code.expert_parallel.train", ""),
    ("14", P, 1, "source_code.expert_parallel.bench", "--world 2 --reps 2"),
    ("15", T, 2, "source_code.profiling.profile_ddp", "--trace-dir TMP/traces"),
    ("15", P, 1, "source_code.profiling.scaling", "--procs 1,2 --steps 5"),
    ("16", T, 2, "source_code.frameworks.lightning_train", "--epochs 1 --max-steps 4"),
    ("16", T, 2, "source_code.frameworks.lightning_train", "--strategy model-parallel --epochs 1 --max-steps 4"),
    ("16", T, 2, "source_code.frameworks.accelerate_train", "--epochs 1 --max-steps 4"),
    ("16", T, 2, "source_code.frameworks.deepspeed_train", "--epochs 1 --max-steps 4 --zero-stage 2"),
    ("16", T, 2, "source_code.frameworks.deepspeed_train", "--epochs 1 --max-steps 4 --zero-stage 3"),
    ("17", P, 1, "source_code.resilience.compare", "--steps 24 --kill-at-step 6 --snapshot-every 4"),
    ("17", P, 1, "source_code.resilience.health_drill", "--world-size 3 --slow-rank 2 --hang-rank 1"),
    ("17", P, 1, "source_code.resilience.elastic", ""),
    ("18", T, 2, "source_code.less_communication.train", "--steps 8 --every 4 --sweep 2 --fragments 2"),
    ("19", P, 1, "source_code.capstone.matrix", ""),
    ("19", T, 4, "source_code.capstone.choose", "--dp 2 --cp 2"),
]
NEEDS = {"lightning_train": "lightning", "accelerate_train": "accelerate", "deepspeed_train": "deepspeed"}
# an exit status 0 is not enough where a script could end well and still be wrong
EXPECT = {"source_code.profiling.hang": (r"mismatch_at=[1-9]|flight recorder: .* needs torch",
                                         "the flight recorders found no mismatch")}
ERROR_LINE = re.compile(r"^\s*(\[rank\d+\]: )?((\w+\.)*\w*(Error|Exception)\b|FAILED: ).*")


def run_one(launcher: str, nproc: int, module: str, args: str, tmp: Path, timeout: float) -> tuple[str, str]:
    """(verdict, detail): ok, refused (exit 2 with one 'error:' line), FAIL, hangs, wrong (ended
    well but its output fails EXPECT), n/a (a framework not installed)."""
    needed = NEEDS.get(module.rsplit(".", 1)[-1])
    if needed and importlib.util.find_spec(needed) is None:
        return "n/a", f"{needed} not installed"
    argv = args.replace("TMP", str(tmp)).split()
    if launcher == T:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               "-m", module, *argv]
    else:
        cmd = [sys.executable, "-m", module, *argv]
    env = {**__import__("os").environ, "OMP_NUM_THREADS": "1", "WORKSHOP_DEVICE": "cpu"}
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                             start_new_session=True)
    except subprocess.TimeoutExpired:
        subprocess.run(["pkill", "-f", f"-m {module}"], capture_output=True)
        return "hangs", f"no end within {timeout:.0f} s"
    errors = [ln for ln in (res.stderr + res.stdout).splitlines() if ln.startswith("error: ")]
    if res.returncode == 0:
        pattern, meaning = EXPECT.get(module, (None, ""))
        if pattern and not re.search(pattern, res.stdout):
            summary = [ln for ln in res.stdout.splitlines() if ln.startswith("summary:")]
            return "wrong", f"{meaning}: {summary[-1] if summary else res.stdout.strip()[-200:]}"
        return "ok", ""
    if errors:  # a one-line refusal (exit 2; torchrun itself then exits 1)
        return "refused", errors[0]
    lines = [ln for ln in (res.stdout + res.stderr).splitlines() if ln.strip()]
    causes = [m.group(0) for m in map(ERROR_LINE.match, lines) if m and "ChildFailedError" not in m.group(0)]
    cause = causes[-1] if causes else (lines[-1] if lines else f"exit status {res.returncode}")
    return "FAIL", " ".join(cause.split())[:300]


def main(argv=None) -> int:
    import torch
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default="", help="notebooks, e.g. 09,10 (default: all)")
    p.add_argument("--timeout", type=positive_float, default=150.0, help="seconds before a run counts as a hang")
    args = p.parse_args(argv)
    only = {n for n in args.only.split(",") if n}
    print(f"torch {torch.__version__} on the CPU (gloo), Python {sys.version.split()[0]}\n")
    print("| notebooks | entry point | verdict | s | detail |\n|---|---|---|---|---|")
    failed = 0
    for notebooks, launcher, nproc, module, margs in ENTRY_POINTS:
        if only and not only & set(notebooks.split()):
            continue
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            verdict, detail = run_one(launcher, nproc, module, margs, Path(tmp), args.timeout)
        failed += verdict in ("FAIL", "hangs", "wrong")
        what = f"`{module.removeprefix('source_code.')} {margs.replace('TMP/', '')}`".replace(" `", "`")
        print(f"| {notebooks} | {what} | {verdict} | {time.perf_counter() - start:.0f} | {detail} |", flush=True)
    print(f"\ntorch_support: {failed} entry point(s) failed or hung on torch {torch.__version__}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
