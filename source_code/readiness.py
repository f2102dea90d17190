"""The day before the course: is this machine ready? One row per requirement, `ok` or the fix.

    make check                                   # with the project's venv
    PYTHON=python3 make check                    # with a cluster's PyTorch module or container
    python -m source_code.readiness --data-dir $DATA --datasets mnist,cifar10

Runs on a laptop, on a GPU node and on a login node without GPUs, in well under 2 minutes,
and never needs the internet. Exit status 1 if a requirement fails (a skipped one does not, nor
a warning: on a cluster's login node the row `where notebooks run` says never to run the
multi-process notebooks there).
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from source_code.cli import Parser

MIN_TORCH = (2, 6)
MIN_FREE_GB = 2.0  # a few snapshots and DCP checkpoints of the workshop's models, with room


class Skip(Exception):
    """Not a failure: the requirement does not apply on this machine (the reason is shown)."""


class Warn(Exception):
    """Not a failure, but what to do differently on this machine (shown as WARN)."""


def _sum_ranks() -> float:  # runs on each spawned rank
    import torch
    import torch.distributed as dist
    from source_code.distributed import context
    t = torch.ones(1, device=context().device) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    return float(t.item())


def check_torch(args) -> str:
    import torch
    version = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    if version < MIN_TORCH:
        raise AssertionError(f"torch {torch.__version__} is older than 2.6: load a newer PyTorch "
                             "module, or `make venv` for the pinned environment")
    return f"torch {torch.__version__}, Python {sys.version.split()[0]}"


# what the notebooks and jobs import besides torch: a site's PyTorch module or container may lack
# some, and `pip install --no-deps -e .` of the clone installs none of them
PACKAGES = {"numpy": "every notebook", "sklearn": "every notebook (the embedded digits)",
            "matplotlib": "every notebook (figures)", "ipykernel": "the lab's kernel",
            "torchvision": "CIFAR-10", "datasets": "make prepare (WikiText-2)",
            "lightning": "16", "accelerate": "16", "deepspeed": "16", "torchft": "17",
            "webdataset": "20", "pyarrow": "20", "torchdata": "20", "litdata": "20"}
EVERY_NOTEBOOK = ("numpy", "sklearn", "matplotlib")


def check_packages(args) -> str:
    from importlib.util import find_spec
    missing = [name for name in PACKAGES if find_spec(name) is None]
    pip = "python3 -m pip install --user " + " ".join("scikit-learn" if n == "sklearn" else n for n in missing)
    if any(n in EVERY_NOTEBOOK for n in missing):
        raise AssertionError(f"missing {', '.join(missing)}: `{pip}` with the course's Python loaded")
    if missing:
        raise Warn(f"missing {', '.join(f'{n} ({PACKAGES[n]})' for n in missing)}: what the notebooks "
                   f"named need; `{pip}` with the course's Python loaded")
    return f"the {len(PACKAGES)} packages the notebooks import besides torch are here"


def check_policy(args) -> str:
    from source_code import device_policy
    try:
        placed = device_policy.choose(0, 1)
    except device_policy.DeviceError as err:
        raise AssertionError(err.message) from None
    return f"one process here computes on {placed.device} with {placed.backend}"


def check_gloo(args) -> str:
    from source_code.processes import spawn
    sums = spawn(_sum_ranks, 2, device="cpu", timeout=90, stream=False)
    assert sums == [3.0, 3.0], f"2 processes summed to {sums}, not 3: reinstall torch"
    return "2 processes on the CPU: all_reduce(1 + 2) = 3 on both"


def check_nccl(args) -> str:
    import torch
    if not torch.cuda.is_available():
        raise Skip("no GPU visible here")
    from source_code.processes import spawn
    n = min(torch.cuda.device_count(), 2)
    sums = spawn(_sum_ranks, n, device="auto", timeout=120, stream=False)
    want = n * (n + 1) / 2
    assert sums == [want] * n, f"NCCL on {n} GPU(s) gave {sums}, not {want}: check the driver and NCCL_* variables"
    return f"{n} process(es) on {n} GPU(s): NCCL all_reduce correct"


def check_jupyter(args) -> str:
    try:
        from jupyter_client.manager import start_new_kernel
    except ImportError:
        raise AssertionError("jupyter_client missing: `make venv` (or pip install -r requirements.txt)") from None
    start = time.perf_counter()
    km, kc = start_new_kernel(kernel_name="python3", startup_timeout=60, stderr=subprocess.DEVNULL)
    try:
        kc.execute_interactive("import torch, source_code; print(torch.__version__)", timeout=60,
                               output_hook=lambda msg: None)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    return f"a kernel started and ran a cell importing torch in {time.perf_counter() - start:.1f} s"


def check_data(args) -> str:
    from source_code import data
    train = data.digits("train")
    return f"embedded digits: {len(train)} training images, no network needed"


def check_prepared(args) -> str:
    if not args.data_dir:
        raise Skip("no --data-dir given (the embedded data needs none)")
    from source_code import data
    missing = []
    for name in [n for n in args.datasets.split(",") if n]:
        try:
            data.load(name, "train", args.data_dir)
        except data.MissingData:
            missing.append(name)
    if missing:
        raise AssertionError(f"{', '.join(missing)} not in {args.data_dir}: on a machine with internet run "
                             f"python -m source_code.data prepare --data-dir {args.data_dir} --dataset {missing[0]}")
    return f"{args.datasets} found in {args.data_dir}"


def container() -> str:
    """The Singularity/Apptainer image this process runs in ('' outside one): the runtime sets
    SINGULARITY_CONTAINER or APPTAINER_CONTAINER inside."""
    return os.environ.get("APPTAINER_CONTAINER") or os.environ.get("SINGULARITY_CONTAINER") or ""


def check_slurm(args) -> str:
    if not shutil.which("sbatch") and container():
        raise Skip(f"inside the container image {container()}, which has no sbatch: the site step and "
                   "the sbatch lines run outside it, in the login node's shell")
    if not shutil.which("sbatch"):
        raise Skip("no sbatch here: not a Slurm login node")
    from source_code.launch import jobs, site_profiles
    site = os.environ.get("WORKSHOP_SITE")
    if not site and jobs.local_test_cluster():  # make cluster-up / make test started it
        return "sbatch found: the workshop's local test cluster; jobs use the local profile"
    if not site:  # a real login node: the local profile's partition and sizes would be wrong
        raise AssertionError("sbatch found but WORKSHOP_SITE is unset: export WORKSHOP_SITE=<one of "
                             f"{', '.join(site_profiles.current_sites())}> (slurm/sites/)")
    profile = site_profiles.load(site)
    return f"sbatch found; WORKSHOP_SITE={site}: {profile.name}, {profile.gpus_per_node} GPUs a node"


def check_login_node(args) -> str:
    """A login node is where sbatch is and no job step is: slurmd sets SLURMD_NODENAME in a batch
    script and in every srun task (an Open OnDemand or Jupyter-JSC lab on a compute node, an
    `srun --pty bash` shell), salloc's shell on the login node has SLURM_JOB_ID but not it (the
    sbatch, srun and salloc manuals). The workshop's local test cluster (make cluster-up) is the
    one machine where the notebooks may still run: it is its own compute node."""
    from source_code.launch import jobs
    host, job, image = socket.gethostname(), os.environ.get("SLURM_JOB_ID"), container()
    if os.environ.get("SLURMD_NODENAME"):
        return f"compute node {os.environ['SLURMD_NODENAME']}, Slurm job {job}: the notebooks may run here"
    if image and not job:   # a site's image has no sbatch: outside any job on a cluster, the login node
        raise Warn(f"{host}, inside the container image {image} and outside any Slurm job: on a cluster "
                   "that is the login node (the image has no sbatch to tell): never run the multi-process "
                   "notebooks here; open the lab on a compute node (notebooks/LAB_ON_A_CLUSTER.md)")
    if not shutil.which("sbatch"):
        return f"no Slurm on {host} (a laptop or a lab server): the notebooks run here"
    if jobs.local_test_cluster():
        return "the workshop's local test cluster: this machine is its own compute node"
    where = (f"{host} is salloc's shell for job {job}, on the login node (its nodes are elsewhere: "
             f"srun --pty bash gets onto one)" if job else
             f"{host} looks like a login node (sbatch here, no Slurm job step)")
    raise Warn(f"{where}: never run the multi-process notebooks here; open the lab on a compute "
               "node (notebooks/LAB_ON_A_CLUSTER.md) and submit the sbatch lines from here")


def check_disk(args) -> str:
    where = Path(args.checkpoint_dir)
    free_gb = shutil.disk_usage(where).free / 1e9
    if free_gb < MIN_FREE_GB:
        raise AssertionError(f"{free_gb:.1f} GB free in {where.resolve()}: free {MIN_FREE_GB:.0f} GB or "
                             "point --checkpoint at a scratch directory")
    return f"{free_gb:.0f} GB free in {where.resolve()}"


CHECKS = {"torch": check_torch, "packages": check_packages, "device policy": check_policy, "gloo, 2 processes": check_gloo,
          "NCCL": check_nccl, "Jupyter kernel": check_jupyter, "embedded data": check_data,
          "prepared datasets": check_prepared, "Slurm and site": check_slurm,
          "where notebooks run": check_login_node, "disk for checkpoints": check_disk}


def main(argv=None) -> int:
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", default=os.environ.get("WORKSHOP_DATA", ""),
                   help="where `python -m source_code.data prepare` put the real datasets (default: WORKSHOP_DATA)")
    p.add_argument("--datasets", default="mnist,cifar10,wikitext2", help="which prepared datasets to expect")
    p.add_argument("--checkpoint-dir", default=".", help="where the course writes checkpoints")
    p.add_argument("--only", default="", help=f"comma-separated subset of: {', '.join(CHECKS)}")
    args = p.parse_args(argv)
    only = [c.strip() for c in args.only.split(",") if c.strip()] or list(CHECKS)
    unknown = [c for c in only if c not in CHECKS]
    if unknown:
        p.error(f"unknown check(s) {', '.join(unknown)}; choose from {', '.join(CHECKS)}")
    failed = warned = 0
    print(f"{'requirement':<22} {'':<7} {'s':>5}  detail, or the fix")
    for name in only:
        start = time.perf_counter()
        try:
            verdict, detail = "ok", CHECKS[name](args)
        except Skip as why:
            verdict, detail = "skipped", str(why)
        except Warn as why:
            verdict, detail, warned = "WARN", str(why), warned + 1
        except Exception as err:  # a failed requirement: its one line is the fix
            failed += 1
            verdict, detail = "FIX", " ".join(str(err).split())[:400] or type(err).__name__
        print(f"{name:<22} {verdict:<7} {time.perf_counter() - start:5.1f}  {detail}", flush=True)
    print(f"readiness: {len(only) - failed} of {len(only)} requirements met or not needed here"
          + (f"; {warned} WARN row(s) to read" if warned else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
