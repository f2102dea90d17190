"""Where a process computes, and which backend its collectives use: the workshop's one policy.

    python -m source_code.device_policy                    # what this machine would choose, and why
    python -m source_code.device_policy --local-world-size 4

One decision for the node and the job, not one per process: every rank's view (its launcher
variables and what torch shows it of the GPUs) goes into ``node_placements`` for its node, and
``job_placements`` makes one answer of the nodes' answers. ``distributed.whoami`` exchanges
the views through the rendezvous store before the process group exists, so the ranks of a job
never disagree (one on the CPU with gloo, the others waiting for it on NCCL). The rules, in order:

1. ``WORKSHOP_DEVICE=cpu`` asks for the CPU on purpose: CPU + gloo. Demos about an algorithm
   rather than the hardware use it (``processes.spawn(..., device="cpu")``). Ranks that ask
   for different things are an error.
2. A GPU node whose CUDA does not start (Slurm or ``*_VISIBLE_DEVICES`` announce GPUs, but
   ``torch.cuda.is_available()`` is False: a wheel for another CUDA, an old driver): an error
   naming the fix. Never a silent CPU run on a GPU node. Some ranks of a node seeing GPUs and
   others none (a select-GPU wrapper that missed a rank) is an error too.
3. A GPU the installed torch build has no kernels for (a V100 is sm_70; CUDA 13 builds such as
   the pinned wheel start at sm_75): an error naming the fix, instead of "no kernel image".
4. Every process gets a GPU of its own: the mixed backend ``cpu:gloo,cuda:nccl`` (CUDA tensors
   go through NCCL, CPU tensors -- a loss to report, a check's result -- through gloo, in one
   process group). A process that sees exactly one GPU uses it, whatever its id (``srun
   --gpus-per-task=1``, LUMI's select-GPU wrapper, ``--gpu-bind=closest``, ``map_gpu``):
   ``cuda:0``. Processes that see the same several GPUs (torchrun on a node) take them in
   local-rank order: ``cuda:LOCAL_RANK``. GPUs are told apart by their UUID, so two processes
   that see the same single GPU (``CUDA_VISIBLE_DEVICES=1`` for both) are caught.
5. Fewer GPUs on a node than processes (a laptop with one GPU running a 4-process demo):
   CPU + gloo for every rank of the job, said in one line; inside a Slurm GPU allocation that
   has a GPU for every process, but a hand-exported ``CUDA_VISIBLE_DEVICES`` hides them, an
   error naming the fix instead. Two ranks never share a GPU under
   NCCL, and one node on the CPU puts the whole job there: one kind of device per job.
6. No CUDA: CPU + gloo. (ROCm GPUs count as CUDA in PyTorch: same rules, RCCL behind "nccl".)
"""
from __future__ import annotations

import argparse
import json
import os
import socket
from dataclasses import dataclass

import torch

from source_code.errors import LaunchError, run_main

MIXED = "cpu:gloo,cuda:nccl"
VISIBLE = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


class DeviceError(LaunchError):
    """A GPU node that cannot be used as it is: one line naming the fix (exit status 2)."""

    def __init__(self, message: str):
        super().__init__(message, every_rank=True)


@dataclass(frozen=True)
class Gpus:
    """What torch shows one process of the GPUs; ``Gpus.probe()`` asks torch, tests build their own."""

    available: bool
    count: int = 0
    capability: tuple[int, int] | None = None  # of the first visible GPU
    name: str = ""
    arch_list: tuple[str, ...] = ()           # what the torch build has kernels for
    hip: bool = False
    uuids: tuple[str, ...] = ()               # one per visible GPU: tells physical GPUs apart

    @staticmethod
    def probe() -> "Gpus":
        if not torch.cuda.is_available():
            return Gpus(False)
        count = torch.cuda.device_count()
        uuids = tuple(str(getattr(torch.cuda.get_device_properties(i), "uuid", "")) for i in range(count))
        return Gpus(True, count, torch.cuda.get_device_capability(0),
                    torch.cuda.get_device_name(0), tuple(torch.cuda.get_arch_list()),
                    torch.version.hip is not None, uuids if all(uuids) else ())


@dataclass(frozen=True)
class Placement:
    device: torch.device
    backend: str      # "gloo" or "cpu:gloo,cuda:nccl"
    note: str = ""    # one line to print (on rank 0) when the policy fell back to the CPU


CPU = Placement(torch.device("cpu"), "gloo")
# the variables a rank's decision reads: what each rank sends to the others before joining
POLICY_VARS = ("WORKSHOP_DEVICE", "SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS",
               "SLURM_GPUS_PER_TASK") + VISIBLE


def gpus_announced(env) -> str:
    """The variable that says this node has GPUs for us (e.g. 'SLURM_GPUS_ON_NODE=4'), or ''."""
    for key in ("SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS"):
        value = env.get(key, "").strip()
        if value and value not in ("0", "none"):
            return f"{key}={value}"
    for key in VISIBLE:  # "" and "-1" hide every GPU on purpose; NoDevFiles: Slurm gave none
        value = env.get(key, "").strip()
        if value and value not in ("-1", "NoDevFiles"):
            return f"{key}={value}"
    return ""


def build_runs_on(capability: tuple[int, int], arch_list) -> bool:
    """Can a build with these arches (``sm_80``, ``compute_90``...) run a GPU of this capability?

    Kernels for sm_Xy run on sm_Xz with z >= y (same major); PTX (compute_XY) is compiled at
    load time for any newer GPU."""
    major, minor = capability
    for arch in arch_list:
        kind, _, num = arch.partition("_")
        if not num.isdigit() or len(num) < 2:
            continue
        a_major, a_minor = int(num[:-1]), int(num[-1])
        if kind == "sm" and a_major == major and a_minor <= minor:
            return True
        if kind == "compute" and (a_major, a_minor) <= (major, minor):
            return True
    return False


def _wanted(env) -> str:
    want = env.get("WORKSHOP_DEVICE", "auto").strip().lower()
    if want not in ("auto", "cpu", "cuda"):
        raise DeviceError(f"error: WORKSHOP_DEVICE={want!r}; use auto, cpu or cuda")
    return want


def _identities(env, gpus: Gpus) -> tuple[str, ...]:
    """Names of the physical GPUs a process sees: UUIDs; without them (old drivers, tests), the
    single id in *_VISIBLE_DEVICES for a one-GPU view, else the index (same view, same GPUs)."""
    if gpus.uuids:
        return gpus.uuids
    ids = [env.get(k, "").strip() for k in VISIBLE if env.get(k, "").strip()]
    if gpus.count == 1 and ids and "," not in ids[-1]:
        return (f"visible {ids[-1]}",)
    return tuple(f"index {i}" for i in range(gpus.count))


def _ranks(local_ranks) -> str:
    return ", ".join(map(str, local_ranks))


def node_placements(envs, views) -> list[Placement]:
    """Each local rank's placement on one node: ``envs[i]`` and ``views[i]`` are local rank i's
    environment and what torch shows it (``Gpus``). Raises DeviceError (the same message for
    every rank) where the node cannot be used as it is. Pure: any node layout is testable."""
    n = len(envs)
    wants = [_wanted(env) for env in envs]
    if len(set(wants)) > 1:
        raise DeviceError(f"error: the ranks of a node ask for different devices (WORKSHOP_DEVICE="
                          f"{', '.join(wants)} for local ranks 0-{n - 1}); export the same value for all")
    if wants[0] == "cpu":
        return [CPU] * n
    seeing = [i for i, g in enumerate(views) if g.available and g.count > 0]
    if not seeing:
        announced = next((a for a in map(gpus_announced, envs) if a), "")
        if announced or wants[0] == "cuda":
            why = f"this node has GPUs ({announced})" if announced else "WORKSHOP_DEVICE=cuda"
            raise DeviceError(
                f"error: {why} but torch {torch.__version__} cannot start CUDA "
                f"(built for CUDA {torch.version.cuda or torch.version.hip or 'none'}; the driver may be "
                "older): load the site's PyTorch module or install a torch wheel built for this "
                "node's CUDA; WORKSHOP_DEVICE=cpu runs on the CPU on purpose")
        return [CPU] * n
    if len(seeing) < n:
        blind = [i for i in range(n) if i not in seeing]
        raise DeviceError(
            f"error: local rank(s) {_ranks(blind)} see no GPU while local rank(s) {_ranks(seeing)} do: "
            "give every process of a node a GPU (check the select-GPU wrapper, --gpu-bind or "
            "CUDA_VISIBLE_DEVICES), or WORKSHOP_DEVICE=cpu to run on the CPU on purpose")
    for g in views:
        if g.capability and g.arch_list and not g.hip and not build_runs_on(g.capability, g.arch_list):
            sm = "sm_%d%d" % g.capability
            raise DeviceError(
                f"error: {g.name} ({sm}) is not supported by this torch build (CUDA "
                f"{torch.version.cuda}, kernels for {', '.join(g.arch_list)}): load the site's "
                f"PyTorch module or install a wheel whose CUDA still supports {sm} (CUDA 12.x for sm_70)")
    seen = [_identities(env, g) for env, g in zip(envs, views)]
    taken, places = [], []
    for i, ids in enumerate(seen):
        index = sum(1 for j in range(i) if seen[j] == ids)  # the i-th rank with this view takes its i-th GPU
        taken.append(ids[index] if index < len(ids) else None)
        places.append(Placement(torch.device("cuda", index), MIXED))
    gpus = len({gpu for ids in seen for gpu in ids})
    if None in taken or len(set(taken)) < n:
        _refuse_hidden_allocation(envs[0], n, gpus)
        return [Placement(CPU.device, CPU.backend,
                          f"note: {n} processes on this node but {gpus} GPU(s): all of them compute "
                          "on the CPU with gloo (NCCL needs one GPU per process; use "
                          f"--nproc-per-node={gpus} to train on the GPUs)")] * n
    return places


def _refuse_hidden_allocation(env, n: int, gpus: int) -> None:
    """Inside a Slurm GPU allocation with a GPU for every process, a *_VISIBLE_DEVICES exported
    by hand (not Slurm's per-task binding) that hides some of them is an error, not a CPU run."""
    given = env.get("SLURM_GPUS_ON_NODE", "").strip()
    hidden = next((k for k in VISIBLE if env.get(k, "").strip()), "")
    if given.isdigit() and int(given) >= n > gpus and hidden and not env.get("SLURM_GPUS_PER_TASK"):
        raise DeviceError(
            f"error: Slurm gave this node {given} GPU(s) for {n} processes, but {hidden}={env[hidden]} "
            f"shows them {gpus}: do not export {hidden} in the job script or the submitting shell "
            "(Slurm sets it), or WORKSHOP_DEVICE=cpu to run on the CPU on purpose")


def job_placements(nodes) -> list[Placement]:
    """One answer for the job. ``nodes``: one ``(ranks, envs, views)`` per node, ``ranks`` the
    global ranks in local-rank order. Returns the placement of every global rank; one node on
    the CPU puts every rank there (one kind of device per job); errors name the node."""
    per_rank, cpu_note = {}, ""
    for host, (ranks, envs, views) in sorted(nodes.items()):
        try:
            placed = node_placements(envs, views)
        except DeviceError as err:
            raise DeviceError(err.message if len(nodes) == 1 else f"{err.message} (node {host})") from None
        cpu_note = cpu_note or next((p.note for p in placed if p.note), "")
        per_rank.update(zip(ranks, placed))
    kinds = {p.device.type for p in per_rank.values()}
    if len(kinds) > 1:
        note = cpu_note or "note: some nodes compute on the CPU: every rank of the job does too"
        return [Placement(CPU.device, CPU.backend, note)] * len(per_rank)
    return [per_rank[r] for r in sorted(per_rank)]


def _srun_task_gpu(env, gpus: Gpus) -> bool:
    """An srun task (no torchrun inside) that sees one GPU Slurm gave to this task alone
    (--gpus-per-task, or a select-GPU wrapper's single id): the others see their own."""
    single = any(env.get(k, "").strip().isdigit() for k in VISIBLE)
    return (gpus.count == 1 and "SLURM_STEP_NUM_TASKS" in env and "TORCHELASTIC_RUN_ID" not in env
            and bool(env.get("SLURM_GPUS_PER_TASK") or single))


def choose(local_rank: int = 0, local_world_size: int = 1, env=None, gpus: Gpus | None = None) -> Placement:
    """This process's placement when no other rank's view is known (one process alone, or a
    launcher without a store to share): every local rank is taken to see what this one sees,
    except an srun task's own GPU (``_srun_task_gpu``). Where the ranks can talk before
    joining, ``distributed.place`` decides from every rank's real view instead."""
    env = os.environ if env is None else env
    if _wanted(env) == "cpu":
        return CPU
    gpus = Gpus.probe() if gpus is None else gpus
    if _srun_task_gpu(env, gpus):
        return node_placements([env], [gpus])[0]
    return node_placements([env] * local_world_size, [gpus] * local_world_size)[local_rank]


def view_of(local_rank: int, env=None, gpus: Gpus | None = None) -> str:
    """What this rank tells the others before the process group exists (JSON)."""
    env = os.environ if env is None else env
    gpus = Gpus.probe() if gpus is None and _wanted(env) != "cpu" else (gpus or Gpus(False))
    return json.dumps({"node": env.get("SLURMD_NODENAME") or socket.gethostname(),
                       "local_rank": local_rank, "env": {k: env[k] for k in POLICY_VARS if k in env},
                       "gpus": {**gpus.__dict__}})


def _gpus_from(d: dict) -> Gpus:  # JSON gave lists where Gpus keeps tuples
    return Gpus(**{**d, **{k: tuple(d[k]) for k in ("arch_list", "uuids")},
                   "capability": tuple(d["capability"]) if d["capability"] else None})


def decide(views: list[str]) -> str:
    """Rank 0's answer for the job from every rank's ``view_of`` (index = global rank): the
    placements, or the one error every rank prints (JSON)."""
    nodes = {}
    for rank, view in enumerate(map(json.loads, views)):
        nodes.setdefault(view["node"], []).append((view["local_rank"], rank, view))
    grouped = {}
    for node, members in nodes.items():
        members.sort(key=lambda m: m[:2])
        grouped[node] = ([m[1] for m in members], [m[2]["env"] for m in members],
                         [_gpus_from(m[2]["gpus"]) for m in members])
    try:
        return json.dumps({"placements": [[str(p.device), p.backend, p.note] for p in job_placements(grouped)]})
    except DeviceError as err:
        return json.dumps({"error": err.message})


def placement_from(answer: str, rank: int) -> Placement:
    """This rank's part of rank 0's ``decide`` answer; the job's error raised on every rank."""
    answer = json.loads(answer)
    if "error" in answer:
        raise DeviceError(answer["error"])
    device, backend, note = answer["placements"][rank]
    return Placement(torch.device(device), backend, note)


def local_world_size(env, world_size: int) -> int:
    """How many processes of the job run on this node (torchrun, srun or spawn say so)."""
    if env.get("LOCAL_WORLD_SIZE"):
        return int(env["LOCAL_WORLD_SIZE"])
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    if per_node and "SLURM_STEP_NUM_TASKS" in env:  # e.g. "4(x2)" or "3,1": expand, pick ours
        counts = []
        for part in per_node.split(","):
            n, _, rep = part.partition("(x")
            counts += [int(n)] * (int(rep.rstrip(")")) if rep else 1)
        node = int(env.get("SLURM_NODEID", 0))
        return counts[node] if node < len(counts) else counts[-1]
    return world_size


def exact_math() -> str:
    """Bitwise-reproducible GPU math for parity checks: no TF32, deterministic cuDNN.

    On Ampere and newer, TF32 matmuls and convolutions round inputs to 10 mantissa bits
    (errors ~1e-3), and cuDNN picks algorithms by timing: both break a 1e-5 comparison
    with a one-process reference. Returns the sentence the checks print: on the CPU it says
    that these are GPU settings rather than claiming them."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    if not torch.cuda.is_initialized():  # this process computes on the CPU: the flags do nothing
        return "exact math: fp32 on the CPU (TF32 and cuDNN are GPU settings)"
    return "exact math: TF32 off, deterministic cuDNN"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--local-rank", type=int, default=0)
    p.add_argument("--local-world-size", type=int, default=1)
    args = p.parse_args(argv)
    gpus = Gpus.probe()
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda}, HIP {torch.version.hip}); "
          f"GPUs visible: {gpus.count}{' ' + gpus.name if gpus.name else ''}; "
          f"announced: {gpus_announced(os.environ) or 'none'}")
    try:
        placed = choose(args.local_rank, args.local_world_size, gpus=gpus)
    except DeviceError as err:
        print(err.message)
        return 2
    print(f"local rank {args.local_rank} of {args.local_world_size}: device {placed.device}, "
          f"backend {placed.backend}" + (f"\n{placed.note}" if placed.note else ""))
    return 0


if __name__ == "__main__":
    run_main(main)
