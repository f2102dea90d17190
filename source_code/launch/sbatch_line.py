"""What an sbatch command line asks for, read before it is submitted (the site step's function):
its own options, its job script and that script's #SBATCH lines, and the cores to add for a
script that runs one task a node (site_step.py's `sbatch` function passes them to sbatch).

A torchrun job script runs one Slurm task a node, and that task's cores are all its processes
get. The scripts ask for 2 (what the CPU test cluster has), and sbatch reads no input variable
that could give a GPU node's share instead (SBATCH_CPUS_PER_GPU: Slurm 22.05 refuses it beside a
script's --cpus-per-task, 23.02.5 and newer drop it): so the function adds --cpus-per-task=N to
the line, the profile's cores per GPU times the GPUs a node the job asks for.

A `sbatch --wrap "python -m ..."` line has no job script to source the site's profile: on a site
whose launches run inside a container image (LUMI: its profile's site_environment names the
image), the wrapped command would run the submitting shell's Python, outside the image, without
torch. The function gets the line back with the command wrapped the way the job scripts run
theirs: the profile sourced, its site_environment (modules, bindings, the image), then
slurm/launch.sh's container_prefix (singularity exec --bind <clone> <image>).
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
    profile's cores per GPU times the job's GPUs a node; (['--ntasks-per-node=G',
    '--cpus-per-task=C'], its note) for one that starts a task per GPU (TASK_PER_GPU=yes: the srun
    script), G the job's GPUs a node, C the profile's cores per GPU; ([], '') where the line sets
    its own cores or tasks, the script runs several tasks a node, or the site has no GPUs."""
    try:
        site = load(env.get("WORKSHOP_SITE", ""))
    except ProfileError:
        return [], ""
    options, script = job_script(argv, cwd)
    given, in_script = read_options(options), script_options(script) if script else {}
    gpus = gpus_a_node(given, env, in_script)
    per_gpu = env.get("SBATCH_CPUS_PER_GPU") or any(w.startswith("--cpus-per-gpu") for w in options)
    if not (script and site.gpu_request and gpus) or "cpus" in given or per_gpu:
        return [], ""
    if "per_node" not in given and "TASK_PER_GPU=yes" in script.read_text(errors="replace"):
        # a task per GPU (the srun script): as many tasks a node as GPUs, each its share of cores
        add = [f"--ntasks-per-node={gpus}", f"--cpus-per-task={site.cpus_per_gpu}"]
        return add, (f"note: the site step adds {' '.join(add)} to the script's task per GPU: {gpus} GPU(s) "
                     f"a node, {site.cpus_per_gpu} core(s) each ({site.key}'s share); sbatch --cpus-per-task=N "
                     "... sets your own")
    if (given.get("per_node") or in_script.get("per_node")) != "1":
        return [], ""
    cores = site.cpus_per_gpu * gpus
    return [f"--cpus-per-task={cores}"], (
        f"note: the site step adds --cpus-per-task={cores} to the script's one task a node: {gpus} GPU(s) "
        f"a node x {site.cpus_per_gpu} core(s) per GPU ({site.key}'s share); sbatch --cpus-per-task=N ... "
        "sets your own")


def wrap_option(words: list[str]) -> tuple[int, str] | None:
    """(index, command) of the --wrap option of sbatch's own options (--wrap CMD or --wrap=CMD)."""
    for i, w in enumerate(words):
        if w == "--wrap" and i + 1 < len(words):
            return i, words[i + 1]
        if w.startswith("--wrap="):
            return i, w[len("--wrap="):]
    return None


def in_site_container(argv: list[str], env: dict, root: Path) -> tuple[list[str], str]:
    """(the sbatch arguments with the --wrap command run inside the site's container image, its
    note) on a site whose profile runs its launches in an image, or where the shell names one
    (WORKSHOP_CONTAINER, WORKSHOP_CONTAINER_EXEC); ([], '') for every other line."""
    try:
        site = load(env.get("WORKSHOP_SITE", ""))
    except ProfileError:
        return [], ""
    named = env.get("WORKSHOP_CONTAINER") or env.get("WORKSHOP_CONTAINER_EXEC")
    found = wrap_option(argv)
    if found is None or not (named or "WORKSHOP_CONTAINER" in site.environment):
        return [], ""
    i, command = found
    inner = (f"ROOT={shlex.quote(str(root))}; source \"$ROOT/slurm/sites/{site.key}.sh\" && site_environment "
             f"&& source \"$ROOT/slurm/launch.sh\" && container_prefix "
             f"&& exec \"${{IN_CONTAINER[@]}}\" bash -c {shlex.quote(command)}")
    wrapped = argv[:i] + ["--wrap", f"bash -c {shlex.quote(inner)}"] + argv[i + (1 if argv[i] != "--wrap" else 2):]
    return wrapped, (f"note: the site step runs the --wrap command inside {site.name}'s container image, "
                     "as the job scripts run theirs (the profile's site_environment, then its image); "
                     "command sbatch ... submits it as typed")
