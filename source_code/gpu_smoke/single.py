"""The checks that need one GPU: every entry point with a GPU path, run at one process on cuda:0.

Each check runs the script as a user would (torchrun with one process, ``python -m``,
``accelerate launch``) and asserts, from what the script prints, that it computed on the GPU
(``harness.computed_on``) and that it did its job (a summary line, a resumed run, a checkpoint
on disk, a device-time split). The MFU check sizes its TransformerLM from the free GPU memory
unless --mfu-* flags give the shape.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from source_code import device_policy, models
from source_code.gpu_smoke.harness import (NPROC, ONE_MORE_THAN_GPUS, PORT, ROOT, TMP, UP_TO_TWO, Check,
                                           Env, Run, Skip, computed_on, line_with)
from source_code.planner import memory as planner_memory
from source_code.processes import spawn
from source_code.training.loop import parse_summary

FRAMEWORK_ARGS = ("--epochs", "1")   # one epoch of the embedded digits: ~22 steps at batch 64
ACCELERATE_YAML = f"{ROOT}/source_code/frameworks/accelerate_fsdp2.yaml"


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


def trained(out: str, env: Env, module: str, at_least: float) -> str:
    """'1 process on cuda:0: accuracy A': the device the script names and its summary's
    accuracy, asserted above ``at_least`` (chance is 0.1 on the digits, 1/vocab on the sort task)."""
    where = computed_on(out, env, module)
    s = parse_summary(out)
    assert s["accuracy"] >= at_least, f"accuracy {s['accuracy']:.3f} < {at_least}: {out[-300:]}"
    n = s["world_size"]
    return f"{n} process{'es' if n > 1 else ''} on {where}: accuracy {s['accuracy']:.3f}"


# --------------------------------------------------------------- the checks
def policy(env: Env, check: Check) -> str:
    placed = device_policy.choose(0, 1)
    if env.device == "cuda" and placed.device.type != "cuda":
        raise AssertionError(f"policy chose {placed.device} on a GPU machine")
    return f"{placed.device} with backend {placed.backend}"


def mixed(env: Env, check: Check) -> str:
    res = spawn(_reduce_both, 1, device=env.policy)[0]
    assert res["device"].startswith(env.device), res
    assert res["device_sum"] == 1 and res["cpu_sum"] == 1, res
    return f"world size 1 on {res['device']} ({res['backend']}): device and CPU tensors all-reduced"


def main_job(env: Env, check: Check) -> str:
    out = env.launch(check)
    return trained(out, env, "training.ddp", 0.7) + " after 2 epochs"  # well above chance (0.1)


def resume(env: Env, check: Check) -> str:
    if not (env.tmp / "snap.pt").exists():
        raise Skip("needs the main_job check's snapshot (run both: --only main_job,resume)")
    out = env.launch(check)
    assert "resumed from" in out and "after epoch 2" in out, out
    where = computed_on(out, env, "training.ddp")
    return f"resumed on {where} after epoch 2, accuracy {parse_summary(out)['accuracy']:.3f}"


def fallback(env: Env, check: Check) -> str:
    n = env.nproc(check, check.runs[0])
    out = env.launch(check)
    assert f"{n} processes on this node but {env.gpus} GPU" in out, out
    computed_on(out, Env("cpu", env.gpus, env.tmp, {}), "training.ddp")
    return f"{n} processes on {env.gpus} GPU(s): one line, then gloo on the CPU"


def parity(env: Env, check: Check) -> str:
    lines = []
    for i, run in enumerate(check.runs):
        if i and env.nproc(check, run) == 1:
            continue  # one GPU: the second run would repeat the first
        out = env.launch(check, i)
        assert "exact math" in out, out
        lines.append(line_with(out, "parity: ").replace("parity: ", ""))
    return "; ".join(lines)


def sync(env: Env, check: Check) -> str:
    out = env.launch(check)
    line = line_with(out, "sync: ")
    assert "in_sync=True" in line, out
    where = computed_on(out, env, "launch.sync_check")
    return f"on {where}: {line[line.index('sync: ') + 6:]}"


def dataparallel(env: Env, check: Check) -> str:
    line = line_with(env.launch(check), "DataParallel:")
    if env.device == "cuda":  # its device_ids say where it ran: [0] on one GPU, [] on the CPU
        assert (f"across {env.gpus} GPUs" if env.gpus >= 2 else "device_ids=[0]") in line, line
    return line


def memory(env: Env, check: Check) -> str:
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


# ---- frameworks: the plain DDP job written for Lightning, Accelerate, DeepSpeed
def framework(env: Env, check: Check, first_word: str, module: str) -> str:
    """A framework script: what it says it wraps (its line starting with ``first_word``), the
    device it names and its summary's accuracy (one epoch: above 0.2, chance is 0.1)."""
    out = env.launch(check)
    return f"{line_with(out, first_word).split(':')[0]}, " + trained(out, env, module, 0.2)


def lightning(env: Env, check: Check) -> str:
    return framework(env, check, "lightning ", "frameworks.lightning_train")


def accelerate(env: Env, check: Check) -> str:
    return framework(env, check, "accelerate (", "frameworks.accelerate_train")


def accelerate_fsdp2(env: Env, check: Check) -> str:
    line = framework(env, check, "accelerate (", "frameworks.accelerate_train")
    assert line.startswith("accelerate (FSDP)"), f"the YAML asks for FSDP, Accelerate ran {line!r}"
    return f"{line} (from {Path(ACCELERATE_YAML).name})"


def deepspeed(env: Env, check: Check) -> str:
    return framework(env, check, "deepspeed ZeRO", "frameworks.deepspeed_train")


# ---- sharding: FSDP2 + DCP, ZeRO by hand, the memory report
def sharding_dcp(env: Env, check: Check) -> str:
    first = env.launch(check, 0)
    where = computed_on(first, env, "sharding.train")
    shards = sorted((env.tmp / "dcp").rglob("*.distcp"))
    assert shards, f"no .distcp files under the checkpoint directory: {first[-300:]}"
    second = env.launch(check, 1)
    assert "resumed from" in second and "after epoch 2" in second, second[-400:]
    computed_on(second, env, "sharding.train")
    s = parse_summary(second)
    return (f"FSDP2 on {where}: 2 epochs, DCP checkpoint on disk ({len(shards)} .distcp "
            f"file{'s' if len(shards) > 1 else ''}), resumed after epoch 2 to epoch 3: {s['steps']} "
            f"steps, loss {s['loss']:.4f}, accuracy {s['accuracy']:.3f}")


def zero(env: Env, check: Check) -> str:
    out = env.launch(check)
    lines = [ln.replace("parity: ", "") for ln in out.splitlines() if ln.startswith("parity: ")]
    assert len(lines) == 2, out[-400:]
    where = computed_on(out, env, "sharding.parity")
    return f"on {where}: " + "; ".join(lines)


def profiler(env: Env, check: Check) -> str:
    """The DDP job under torch.profiler: on a GPU the computation/communication split is in
    device (GPU) time, said by the script and recorded in its --out JSON as clock=device."""
    out = env.launch(check)
    where = computed_on(out, env, "profiling.profile_ddp")
    assert (env.tmp / "traces" / "rank0.json").stat().st_size > 0, "no trace written"
    clock = json.loads((env.tmp / "profile.json").read_text()).get("clock", "host")
    summary = parse_summary(out)
    if env.device == "cuda":
        assert clock == "device" and "GPU (device) time" in out, \
            f"the split is not in device time on {where} (clock={clock}): {out[-300:]}"
        assert summary["compute_ms"] > 0, f"no GPU computation time recorded: {summary}"
    return (f"on {where}, split by {clock} time: computation {summary['compute_ms']:.1f} ms, "
            f"communication {summary['comm_ms']:.1f} ms, step {summary['step_ms']:.1f} ms")


def memory_report(env: Env, check: Check) -> str:
    out = env.launch(check)
    where = computed_on(out, env, "sharding.memory_report")
    error = line_with(out, "worst prediction error:")
    return f"on {where}: {line_with(out, 'fsdp_state_bytes_ratio=')}, {error}"


# ---- model FLOPs utilisation, sized to the GPU
MFU_DEFAULT = {"dim": 2048, "layers": 8, "seq": 2048, "batch": 8, "vocab": 32768}  # ~28 GiB
MFU_FLOORS = (("layers", 2), ("batch", 1), ("seq", 512), ("dim", 512))  # halved in this order


def mfu_bytes(shape: dict) -> int:
    """Bytes a training step of this TransformerLM shape needs, counted as the planner counts
    them: fp32 weights, gradients and AdamW state (16 bytes per parameter) plus the activations
    saved for backward at 4 bytes a value (an upper bound under bf16 autocast)."""
    with torch.device("meta"):
        n_params = models.count_parameters(models.TransformerLM(
            vocab_size=shape["vocab"], dim=shape["dim"], n_layers=shape["layers"], n_heads=1,
            max_len=shape["seq"]))
    heads = max(shape["dim"] // 64, 1)
    return (planner_memory.state_bytes(n_params, 1, "ddp")["total"]
            + planner_memory.activation_bytes(shape["batch"], shape["seq"], shape["dim"],
                                              shape["layers"], heads, shape["vocab"]))


def size_mfu(free_bytes: int, shape: dict | None = None, fraction: float = 0.7) -> dict:
    """The largest shape, from ``shape`` (default MFU_DEFAULT) down, that needs at most
    ``fraction`` of ``free_bytes``: layers, then batch, then sequence, then width halved."""
    shape = dict(shape or MFU_DEFAULT)
    while mfu_bytes(shape) > fraction * free_bytes:
        for key, floor in MFU_FLOORS:
            if shape[key] > floor:
                shape[key] //= 2
                break
        else:
            break  # the smallest shape: let the run say whether it fits
    return shape


def mfu(env: Env, check: Check) -> str:
    """Model FLOPs utilisation of a GPU-sized TransformerLM step, bf16 autocast + torch.compile,
    against the bf16 matmul peak measured in the same run (goal on one H100: >= 40 %)."""
    from source_code.profiling import mfu as mfu_module
    given = {k[len("mfu_"):]: v for k, v in env.options.items()}
    if given:
        shape, why = {**MFU_DEFAULT, **given}, "shape from the --mfu-* flags"
    else:
        free, _ = torch.cuda.mem_get_info()
        shape = size_mfu(free)
        why = (f"shape sized from {free / 2**30:.1f} GiB free "
               f"(needs ~{mfu_bytes(shape) / 2**30:.1f} GiB)")
    r = mfu_module.measure(**shape, device="cuda", bf16=True, compile=True, steps=10)
    assert 0 < r["mfu"] < 1.05, f"MFU {r['mfu']:.3f} outside (0, 1]: a wrong FLOP count or timing"
    # the goal is against the datasheet bf16 peak (published MFU's denominator), as on an H100 SXM
    sheet = r.get("mfu_datasheet")
    goal = ("no datasheet peak for this GPU: the 40 % goal cannot be judged" if sheet is None else
            f"{'meets' if sheet >= 0.40 else 'below'} the 40 % goal (of the datasheet peak)")
    return f"{why}: {mfu_module.describe(r)} ({goal})"


CHECKS = [
    Check("policy", 1, (Run("call", "source_code.device_policy", ("choose(0, 1)",)),), policy),
    Check("mixed", 1, (Run("spawn", "source_code.gpu_smoke.single", ("_reduce_both()",)),), mixed),
    Check("main_job", 1, (Run("torchrun", "source_code.training.ddp",
                              ("--epochs", "2", "--checkpoint", f"{TMP}/snap.pt")),), main_job),
    Check("resume", 1, (Run("torchrun", "source_code.training.ddp",
                            ("--epochs", "3", "--checkpoint", f"{TMP}/snap.pt", "--resume")),), resume),
    Check("fallback", 1, (Run("torchrun", "source_code.training.ddp", ("--epochs", "1", "--max-steps", "3"),
                              nproc=ONE_MORE_THAN_GPUS),), fallback,
          gpu_only="shows the GPU-to-CPU fallback: needs a GPU"),
    Check("parity", 1, (Run("torchrun", "source_code.parity"),
                        Run("torchrun", "source_code.parity", nproc=UP_TO_TWO)), parity),
    Check("sync", 1, (Run("torchrun", "source_code.launch.sync_check", nproc=UP_TO_TWO),), sync),
    Check("dataparallel", 1, (Run("python", "source_code.training.dataparallel",
                                  ("--epochs", "1", "--max-steps", "5")),), dataparallel),
    Check("memory", 1, (Run("call", "source_code.models", ("TransformerLM().cuda() + one backward",)),),
          memory, gpu_only="CUDA memory figures need a GPU"),
    Check("lightning", 1, (Run("torchrun", "source_code.frameworks.lightning_train", FRAMEWORK_ARGS),),
          lightning, package="lightning"),
    Check("lightning_fsdp", 1, (Run("torchrun", "source_code.frameworks.lightning_train",
                                    ("--strategy", "fsdp", *FRAMEWORK_ARGS)),),
          lightning, package="lightning", gpu_only="Lightning's FSDPStrategy needs a GPU"),
    Check("accelerate", 1, (Run("torchrun", "source_code.frameworks.accelerate_train", FRAMEWORK_ARGS),),
          accelerate, package="accelerate"),
    Check("accelerate_fsdp2", 1, (Run("accelerate", "source_code.frameworks.accelerate_train", FRAMEWORK_ARGS,
                                      launcher=("--config_file", ACCELERATE_YAML, "--num_processes", NPROC,
                                                "--main_process_port", PORT)),),
          accelerate_fsdp2, package="accelerate",
          gpu_only="Accelerate's FSDP2 from the YAML needs a GPU (on CPU it silently becomes DDP)"),
    Check("deepspeed", 1, (Run("torchrun", "source_code.frameworks.deepspeed_train",
                               ("--zero-stage", "3", *FRAMEWORK_ARGS)),), deepspeed, package="deepspeed"),
    Check("sharding_dcp", 1, (Run("torchrun", "source_code.sharding.train",
                                  ("--epochs", "2", "--checkpoint", f"{TMP}/dcp")),
                              Run("torchrun", "source_code.sharding.train",
                                  ("--epochs", "3", "--checkpoint", f"{TMP}/dcp", "--resume"))),
          sharding_dcp),
    Check("zero", 1, (Run("torchrun", "source_code.sharding.parity",
                          ("--impls", "zero1", "zero2", "--steps", "3")),), zero),
    Check("profiler", 1, (Run("torchrun", "source_code.profiling.profile_ddp",
                              ("--trace-dir", f"{TMP}/traces", "--out", f"{TMP}/profile.json")),), profiler),
    Check("memory_report", 1, (Run("python", "source_code.sharding.memory_report", ("--world-sizes", "1")),),
          memory_report),
    Check("mfu", 1, (Run("call", "source_code.profiling.mfu",
                         ("measure(shape sized from free GPU memory or --mfu-*, bf16, compile)",)),),
          mfu, gpu_only="MFU with bf16 autocast and torch.compile: needs a GPU"),
]
