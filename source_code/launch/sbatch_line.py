"""What an sbatch command line asks for, read before it is submitted (the site step's function):
its own options, its job script and that script's #SBATCH lines, and the cores to add for a
script that runs one task a node (site_step.py's `sbatch` function passes them to sbatch).

A torchrun job script runs one Slurm task a node, and that task's cores are all its processes
get. The scripts ask for 2 (what the CPU test cluster has), and sbatch reads no input variable
that could give a GPU node's share instead (SBATCH_CPUS_PER_GPU: Slurm 22.05 refuses it beside a
script's --cpus-per-task, 23.02.5 and newer drop it): so the function adds --cpus-per-task=N to
the line, the profile's cores per GPU times the GPUs a node the job asks for.
"""
from __future__ import annotations

import re
import shlex
from pathlib import Path

from source_code.launch.site_profiles import ProfileError, load

OPTIONS = {"-N": "nodes", "--nodes": "nodes", "-p": "partition", "--partition": "partition",
           "-t": "time", "--time": "time", "-c": "cpus", "--cpus-per-task": "cpus",
           "--ntasks-per-node": "per_node", "--gpus-per-node": "gpus", "--gres": "gres"}


def read_options(words: list[str]) -> dict:
    """{nodes, partition, time, cpus, per_node, gpus, gres} as these sbatch options give them
    (the last one wins)."""
    found, i = {}, 0
    while i < len(words):
        w = words[i]
        for flag, key in OPTIONS.items():
            if w == flag and i + 1 < len(words):
                found[key], i = words[i + 1], i + 1
                break
            if w.startswith(flag + "=") or (not flag.startswith("--") and w.startswith(flag) and len(w) > 2
                                            and not w.startswith("--")):
                found[key] = w[len(flag):].lstrip("=")
                break
        i += 1
    return found


def job_script(words: list[str], cwd: Path) -> tuple[list[str], Path | None]:
    """(sbatch's own options, the job script) of an sbatch command line (no script: --wrap)."""
    for i, w in enumerate(words):
        path = cwd / w
        if not w.startswith("-") and path.is_file() and path.read_text(errors="replace").startswith("#!"):
            return words[:i], path
    return words, None


def script_options(path: Path) -> dict:
    """The #SBATCH lines of a job script, up to its first command (where sbatch stops reading)."""
    words = []
    for line in path.read_text(errors="replace").splitlines()[1:]:
        if line.startswith("#SBATCH"):
            words += shlex.split(line[len("#SBATCH"):], comments=True)
        elif line.strip() and not line.lstrip().startswith("#"):
            break
    return read_options(words)


def gpus_a_node(given: dict, env: dict, in_script: dict) -> int:
    """The GPUs a node the job asks for: the options, else the step's variables, else the script
    (--gpus-per-node=[type:]N, --gres=gpu[:type]:N); 0 where none says."""
    for src in (given, env, in_script):
        gpus = src.get("gpus") or src.get("SBATCH_GPUS_PER_NODE") or ""
        gres = src.get("gres") or src.get("SBATCH_GRES") or ""
        m = re.fullmatch(r"(?:\w+:)?(\d+)", gpus) or re.fullmatch(r"gpu(?::\w+)?:(\d+)", gres)
        if m:
            return int(m.group(1))
    return 0


def cores_option(argv: list[str], env: dict, cwd: Path) -> tuple[list[str], str]:
    """(['--cpus-per-task=N'], its note) for a job script that runs one task a node, N the
    profile's cores per GPU times the job's GPUs a node; ([], '') where the line sets its own
    cores, the script runs several tasks a node, or the site has no GPUs."""
    try:
        site = load(env.get("WORKSHOP_SITE", ""))
    except ProfileError:
        return [], ""
    options, script = job_script(argv, cwd)
    given, in_script = read_options(options), script_options(script) if script else {}
    gpus = gpus_a_node(given, env, in_script)
    per_gpu = env.get("SBATCH_CPUS_PER_GPU") or any(w.startswith("--cpus-per-gpu") for w in options)
    if not (script and site.gpu_request and gpus) or "cpus" in given or per_gpu \
            or (given.get("per_node") or in_script.get("per_node")) != "1":
        return [], ""
    cores = site.cpus_per_gpu * gpus
    return [f"--cpus-per-task={cores}"], (
        f"note: the site step adds --cpus-per-task={cores} to the script's one task a node: {gpus} GPU(s) "
        f"a node x {site.cpus_per_gpu} core(s) per GPU ({site.key}'s share); sbatch --cpus-per-task=N ... "
        "sets your own")
