"""The GPU paths, run for real: one line per check (ok / FAIL / skipped: why).

    make gpu-smoke                          # with the project's venv
    PYTHON=python3 make gpu-smoke           # with a machine's own python3 (torch >= 2.6, no venv)
    python -m source_code.gpu_smoke --device cpu --only policy,mixed   # the harness itself, on CPU
    python -m source_code.gpu_smoke --only mfu --mfu-dim 4096 --mfu-layers 4 --mfu-seq 4096 --mfu-batch 4

Needs torch, torchvision, scikit-learn and matplotlib; nothing is downloaded. With one GPU
the checks that need NCCL between several ranks say "skipped: needs 2 GPUs": a one-GPU
machine runs NCCL with world size 1, and multi-process demos take the CPU/gloo path there.
Exit status 1 if any check failed.
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch

from source_code import device_policy, models
from source_code.cli import Parser, positive_int
from source_code.errors import run_main
from source_code.processes import ProcessesFailed, rank_lines, spawn, torchrun
from source_code.training.loop import parse_summary


class Skip(Exception):
    """A check that cannot run on this machine (the reason is printed)."""


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _need_gpus(n: int) -> None:
    if _gpus() < n:
        raise Skip(f"needs {n} GPU{'s' if n > 1 else ''}")


# --------------------------------------------------------------- run inside spawned groups
def _reduce_both() -> dict:
    """All-reduce a tensor on this rank's device and a CPU tensor, in the one (mixed) group."""
    import torch.distributed as dist
    from source_code.distributed import context
    ctx = context()
    on_device = torch.ones(4, device=ctx.device) * (ctx.rank + 1)
    on_cpu = torch.ones(4) * (ctx.rank + 1)
    dist.all_reduce(on_device)  # NCCL for a CUDA tensor
    dist.all_reduce(on_cpu)     # gloo for a CPU tensor, same group
    return {"backend": ctx.backend, "device": str(ctx.device),
            "device_sum": on_device[0].item(), "cpu_sum": on_cpu[0].item()}


def _ring_and_server() -> dict:
    from source_code.sync.harness import compare_with_library
    return compare_with_library(sizes=(5, 4099))


# --------------------------------------------------------------- the checks
def check_policy(device: str) -> str:
    placed = device_policy.choose(0, 1)
    if device == "cuda" and placed.device.type != "cuda":
        raise AssertionError(f"policy chose {placed.device} on a GPU machine")
    return f"{placed.device} with backend {placed.backend}"


def check_mixed(device: str) -> str:
    res = spawn(_reduce_both, 1, device="auto" if device == "cuda" else "cpu")[0]
    assert res["device_sum"] == 1 and res["cpu_sum"] == 1, res
    return f"world size 1 on {res['device']} ({res['backend']}): device and CPU tensors all-reduced"


def check_nccl_multi(device: str) -> str:
    _need_gpus(2)
    n = _gpus()
    res = spawn(_reduce_both, n)
    want = n * (n + 1) / 2
    assert all(r["device_sum"] == want and r["cpu_sum"] == want for r in res), res
    return f"{n} ranks on {n} GPUs: NCCL and gloo sums equal {want:g}"


def check_main_job(device: str, tmp: Path) -> str:
    snap = tmp / "snap.pt"
    out = rank_lines(torchrun("source_code.training.ddp", "--epochs", 2, "--checkpoint", snap, nproc=1,
                              device="auto" if device == "cuda" else "cpu").stdout)
    assert f"on {device}" in out, out
    s = parse_summary(out)
    assert s["accuracy"] >= 0.7, out  # 2 epochs of one process: well above chance (0.1)
    return f"1 process on {device}: accuracy {s['accuracy']:.3f} after 2 epochs"


def check_resume(device: str, tmp: Path) -> str:
    if not (tmp / "snap.pt").exists():
        raise Skip("needs the main-job check's snapshot")
    out = rank_lines(torchrun("source_code.training.ddp", "--epochs", 3, "--checkpoint", tmp / "snap.pt",
                              "--resume", nproc=1, device="auto" if device == "cuda" else "cpu").stdout)
    assert "resumed from" in out and "after epoch 2" in out, out
    return f"resumed on {device} after epoch 2, accuracy {parse_summary(out)['accuracy']:.3f}"


def check_main_job_multi(device: str, tmp: Path) -> str:
    _need_gpus(2)
    out = rank_lines(torchrun("source_code.training.ddp", "--epochs", 2, nproc=_gpus()).stdout)
    return f"{_gpus()} GPUs: accuracy {parse_summary(out)['accuracy']:.3f}"


def check_fallback(device: str, tmp: Path) -> str:
    if device != "cuda":
        raise Skip("shows the GPU-to-CPU fallback: needs a GPU")
    n = _gpus() + 1
    out = rank_lines(torchrun("source_code.training.ddp", "--epochs", 1, "--max-steps", 3, nproc=n).stdout)
    assert f"{n} processes on this node but {_gpus()} GPU" in out, out
    return f"{n} processes on {_gpus()} GPU(s): one line, then gloo on the CPU"


def check_parity(device: str, tmp: Path) -> str:
    lines = []
    for n in sorted({1, min(2, max(_gpus(), 1))}):
        out = rank_lines(torchrun("source_code.parity", nproc=n, device="auto" if device == "cuda" else "cpu").stdout)
        assert "exact math" in out, out
        lines.append(out.strip().splitlines()[-1].replace("parity: ", ""))
    return "; ".join(lines)


def check_sync(device: str, tmp: Path) -> str:
    n = max(1, min(_gpus(), 2)) if device == "cuda" else 2
    out = torchrun("source_code.launch.sync_check", nproc=n, device="auto" if device == "cuda" else "cpu").stdout
    line = [ln for ln in out.splitlines() if "sync: " in ln][-1]
    assert "in_sync=True" in line, out
    return line[line.index("sync: ") + 6:]


def check_ring(device: str) -> str:
    if device == "cuda":
        _need_gpus(3)  # the parameter server needs a server and 2 workers
    worst = max(max(r.values()) for r in spawn(_ring_and_server, 3, device="auto" if device == "cuda" else "cpu"))
    assert worst <= 1e-6, worst
    return f"ring, naive ring and parameter server equal dist.all_reduce (max diff {worst:.1e})"


def check_dataparallel(device: str, tmp: Path) -> str:
    import subprocess
    res = subprocess.run([sys.executable, "-m", "source_code.training.dataparallel", "--epochs", "1",
                          "--max-steps", "5"], capture_output=True, text=True, check=True)
    line = [ln for ln in res.stdout.splitlines() if ln.startswith("DataParallel:")][0]
    if _gpus() >= 2:
        assert f"across {_gpus()} GPUs" in line, line
    return line


def check_memory(device: str) -> str:
    if device != "cuda":
        raise Skip("CUDA memory figures need a GPU")
    torch.cuda.reset_peak_memory_stats()
    model = models.TransformerLM().cuda()
    counted = sum(p.numel() * p.element_size() for p in model.parameters())
    allocated = torch.cuda.memory_allocated()
    assert allocated >= counted, (allocated, counted)
    x = torch.randint(0, 16, (32, 16), device="cuda")
    model(x).sum().backward()
    peak = torch.cuda.max_memory_allocated()
    del model, x
    return (f"TransformerLM parameters {counted / 2**20:.2f} MiB counted, {allocated / 2**20:.2f} MiB "
            f"allocated; peak after one backward {peak / 2**20:.2f} MiB")


# the shape check_mfu measures; main() sets it from --mfu-dim, --mfu-layers, --mfu-seq, --mfu-batch
MFU_SHAPE = {"dim": 2048, "layers": 8, "seq": 2048, "batch": 8, "vocab": 32768}


def check_mfu(device: str) -> str:
    """Model FLOPs utilisation of a GPU-sized TransformerLM step, bf16 autocast + torch.compile,
    against the bf16 matmul peak measured in the same run (goal on one H100: >= 40 %)."""
    if device != "cuda":
        raise Skip("MFU with bf16 autocast and torch.compile: needs a GPU")
    from source_code.profiling import mfu
    r = mfu.measure(**MFU_SHAPE, device="cuda", bf16=True, compile=True, steps=10)
    assert 0 < r["mfu"] < 1.05, f"MFU {r['mfu']:.3f} outside (0, 1]: a wrong FLOP count or timing"
    return f"{mfu.describe(r)} ({'meets' if r['mfu'] >= 0.40 else 'below'} the 40 % goal)"


CHECKS = {"policy": check_policy, "mixed": check_mixed, "nccl_multi": check_nccl_multi,
          "main_job": check_main_job, "resume": check_resume, "main_job_multi": check_main_job_multi,
          "fallback": check_fallback, "parity": check_parity, "sync": check_sync, "ring": check_ring,
          "dataparallel": check_dataparallel, "memory": check_memory, "mfu": check_mfu}


def main(argv=None) -> int:
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                   help="auto: cuda where a GPU is visible; cpu runs the harness without a GPU")
    p.add_argument("--only", default="", help=f"comma-separated subset of: {', '.join(CHECKS)}")
    for key in ("dim", "layers", "seq", "batch"):
        p.add_argument(f"--mfu-{key}", type=positive_int, default=MFU_SHAPE[key],
                       help=f"the mfu check's TransformerLM {key} (default {MFU_SHAPE[key]})")
    args = p.parse_args(argv)
    MFU_SHAPE.update({k: getattr(args, f"mfu_{k}") for k in ("dim", "layers", "seq", "batch")})
    only = [c for c in args.only.split(",") if c] or list(CHECKS)
    unknown = sorted(set(only) - set(CHECKS))
    if unknown:
        p.error(f"unknown check(s) {', '.join(unknown)}; choose from {', '.join(CHECKS)}")
    device = args.device if args.device != "auto" else "cuda"
    gpu = f"{_gpus()} x {torch.cuda.get_device_name(0)}" if _gpus() else "no GPU"
    print(f"gpu-smoke: torch {torch.__version__} (CUDA {torch.version.cuda}, HIP {torch.version.hip}), "
          f"{gpu}, checks on {device}", flush=True)
    if device == "cuda" and not torch.cuda.is_available():
        print("skipped: no GPU visible (torch.cuda.is_available() is False); "
              "--device cpu runs the same harness on the CPU")
        return 0
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in only:
            fn = CHECKS[name]
            start = time.perf_counter()
            try:
                takes_tmp = fn.__code__.co_argcount == 2
                detail = fn(device, Path(tmp)) if takes_tmp else fn(device)
                verdict = "ok"
            except Skip as why:
                verdict, detail = "skipped", str(why)
            except (AssertionError, ProcessesFailed, Exception) as err:  # report, go on
                failed += 1
                verdict, detail = "FAIL", " ".join(str(err).split())[-400:]
            print(f"{verdict:>7}  {name:<15} {time.perf_counter() - start:5.1f}s  {detail}", flush=True)
    print(f"gpu-smoke: {len(only) - failed} of {len(only)} checks did not fail")
    return 1 if failed else 0


if __name__ == "__main__":
    run_main(main)
