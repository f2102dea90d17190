"""The site step: one line per shell session, after which every bare `sbatch slurm/<job>.slurm`
asks for what the site needs.

    eval "$(python -m source_code.launch.site_profiles --site lumi --account project_X --format exports)"
    eval "$(python -m source_code.launch.site_profiles --site roihu --account project_X \\
            --reservation course_day1 --format exports)"
    sbatch slurm/ddp_multinode.slurm          # now on the site's GPU partition, with its GPUs

It prints `export` lines of Slurm's own input variables, which sbatch reads and which win over
a job script's #SBATCH lines (a flag on the sbatch command line wins over both):

| variable              | sbatch flag        | from                                         |
|-----------------------|--------------------|----------------------------------------------|
| SBATCH_ACCOUNT        | --account          | --account (the billing project)              |
| SBATCH_PARTITION      | --partition        | the profile, the reservation's own, --partition |
| SBATCH_GPUS_PER_NODE  | --gpus-per-node    | the profile's request (LUMI, the test cluster)  |
| SBATCH_GRES           | --gres             | the profile's request (Roihu, JURECA)           |
| SBATCH_MEM_PER_GPU    | --mem-per-gpu      | the profile's memory per GPU (not on whole-node sites) |
| SBATCH_TIMELIMIT      | --time             | --time (else each script's own #SBATCH --time)  |
| SBATCH_RESERVATION    | --reservation      | --reservation (a course's reserved nodes)       |

and WORKSHOP_SITE, which the job scripts read for the site's module lines and checks. Every
one of these exists in Slurm 22.05 (the test cluster) and in the sites' newer versions.
sbatch has no input variable for --nodes, --ntasks-per-node or --cpus-per-task: those stay in
the job scripts' #SBATCH lines (the node count is what a script is about; one task per node
with torchrun), and the cores come from the function below.
Variables of an earlier site step that this site does not set are unset, so a shell can move
from one site's profile to another's.

The step also defines a shell function `sbatch` in that shell: before each submission it reads
the job's node count and time (the sbatch options, else the job script's #SBATCH lines) and its
partition, time and GPUs a node (the options, else the step's SBATCH_ variables) and refuses,
in one line with exit status 2, a job its partition cannot take (the profile's SITE_LIMITS: nodes,
time, and the GPUs of the whole job where a partition caps them, as Roihu's gpumedium). Slurm's
default EnforcePartLimits=NO would accept it, and it would pend for ever. A job script that runs
one task a node (torchrun's: #SBATCH --ntasks-per-node=1) gets --cpus-per-task=N added, the
profile's cores per GPU times the GPUs a node the job asks for, unless the line gives its own
(said in one note line; the job's first line shows its cores per task); the srun script (a task
per GPU) gets --ntasks-per-node=<GPUs a node> --cpus-per-task=<the share>. A `--wrap "..."` line on
a site whose jobs run inside a container image (LUMI) has its command run inside the image, as
the job scripts run theirs (sbatch_line.py; one note line). Everything else goes to the real
sbatch unchanged (`command sbatch ...` skips the function):

    python -m source_code.launch.site_step [SBATCH OPTIONS] SCRIPT [ARGS]   # what the function runs
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from source_code.launch.sbatch_line import (cores_option, gpus_a_node, in_site_container, job_script,
                                            read_options, script_options)
from source_code.launch.site_profiles import ProfileError, Site, check_limits, guessed, human, load, minutes

VARIABLES = ("SBATCH_ACCOUNT", "SBATCH_PARTITION", "SBATCH_GPUS_PER_NODE", "SBATCH_GRES",
             "SBATCH_MEM_PER_GPU", "SBATCH_TIMELIMIT", "SBATCH_RESERVATION")


def gpu_variable(site: Site, per_node: int) -> tuple[str, str] | None:
    """The profile's GPU request as Slurm's input variable: ('SBATCH_GRES', 'gpu:v100:4')..."""
    m = re.fullmatch(r"--(gres|gpus-per-node)=(.*)", site.gpu_request.format(n=per_node))
    if not m:
        return None
    return ("SBATCH_GRES" if m.group(1) == "gres" else "SBATCH_GPUS_PER_NODE"), m.group(2)


def reservation_partition(name: str) -> str | None:
    """The partition a reservation was made in, as scontrol shows it (None: none or unknown)."""
    if not shutil.which("scontrol"):
        return None
    res = subprocess.run(["scontrol", "-o", "show", "reservation", name], capture_output=True, text=True)
    if res.returncode != 0 or "ReservationName=" not in res.stdout:
        raise ProfileError(f"error: no reservation {name!r} on this cluster (scontrol show reservation "
                           "lists them); check its name with the course's instructor")
    m = re.search(r"\bPartitionName=(\S+)", res.stdout)
    return m.group(1) if m and m.group(1) != "(null)" else None


def choose_partition(site: Site, per_node: int, test: bool) -> str:
    if test:
        if per_node > site.test_max_gpus:
            raise ProfileError(f"error: {site.name}'s test partition {site.partition_test} takes at "
                               f"most {site.test_max_gpus} GPUs; ask for fewer with --gpus-per-node")
        return site.partition_test
    if per_node <= site.partition_max_gpus:
        return site.partition
    if per_node != site.gpus_per_node:
        raise ProfileError(f"error: {site.name}'s {site.partition_full_nodes} takes whole nodes of "
                           f"{site.gpus_per_node} GPUs; use --gpus-per-node {site.partition_max_gpus} "
                           f"or {site.gpus_per_node}")
    return site.partition_full_nodes


def check_partition_gpus(site: Site, part: str, per_node: int) -> None:
    """A partition named by --partition or by a reservation must take the GPUs asked for too."""
    if part == site.partition_test and per_node > site.test_max_gpus:
        choose_partition(site, per_node, test=True)                  # its one-line refusal
    elif part == site.partition_full_nodes != site.partition and per_node != site.gpus_per_node:
        raise ProfileError(f"error: {site.name}'s {part} takes whole nodes of {site.gpus_per_node} GPUs; "
                           f"this asks for {per_node} per node: --gpus-per-node {site.gpus_per_node}, "
                           "or a reservation or partition for partial nodes")
    elif part == site.partition != site.partition_full_nodes and per_node > site.partition_max_gpus:
        raise ProfileError(f"error: {site.name}'s {part} takes at most {site.partition_max_gpus} GPUs "
                           f"per node; this asks for {per_node}: --gpus-per-node {site.partition_max_gpus}, "
                           f"or a reservation or partition of whole nodes ({site.partition_full_nodes})")


def exports(key: str, account: str | None = None, gpus_per_node: int | None = None,
            time: str | None = None, reservation: str | None = None, partition: str | None = None,
            test: bool = False) -> list[tuple[str, str]]:
    """[(variable, value), ...] for the site step, in the order they are printed."""
    site = load(key)
    per = site.gpus_per_node if gpus_per_node is None else gpus_per_node
    if not 1 <= per <= site.gpus_per_node:
        raise ProfileError(f"error: --gpus-per-node {per}: {site.name}'s nodes have 1 to "
                           f"{site.gpus_per_node} GPUs")
    part = partition or (reservation and reservation_partition(reservation)) \
        or choose_partition(site, per, test)
    check_partition_gpus(site, part, per)
    if time is not None:
        minutes(time)
        check_limits(site, part, 1, time)
        if test and minutes(time) > site.test_max_minutes:
            raise ProfileError(f"error: {site.name}'s test partition takes at most "
                               f"{site.test_max_minutes} min; drop --test or ask for less")
    out = [("WORKSHOP_SITE", key), ("SBATCH_PARTITION", part)]
    if account:
        out.append(("SBATCH_ACCOUNT", account))
    gpu = gpu_variable(site, per)
    if gpu:
        out.append(gpu)
        if site.mem_per_node_gb:
            out.append(("SBATCH_MEM_PER_GPU", f"{site.mem_per_gpu_gb}G"))
    if time is not None:
        out.append(("SBATCH_TIMELIMIT", time))
    if reservation:
        out.append(("SBATCH_RESERVATION", reservation))
    return out


def shell_lines(pairs: list[tuple[str, str]]) -> str:
    """`unset` for this step's variables it does not set, one `export` per variable, then the
    `sbatch` function that checks each job against its partition's limits first."""
    keys = {k for k, _ in pairs}
    stale = [v for v in VARIABLES if v not in keys]
    lines = [f"unset {' '.join(stale)}"] if stale else []
    lines += [f"export {k}={shlex.quote(v)}" for k, v in pairs]
    return "\n".join(lines + [guard_function()])


def guard_function() -> str:
    """The shell function: this module reads the job first; its exit status 2 stops the
    submission, 0 passes the options it printed (the cores) before the line's own, 3 submits the
    whole line it printed instead (shell words: a --wrap command run in the site's image), anything else
    lets sbatch decide. The Python is tried when the function runs: the step's own, else (where
    that one cannot start, exit status 126 or 127: a module unloaded since, a container's path
    that exists only inside its image) the python3 on PATH then; where neither starts, it says
    so in one line first, never silently."""
    root = shlex.quote(str(Path(__file__).resolve().parents[2]))
    python = shlex.quote(sys.executable)
    return (f"sbatch() {{ local add s=127 py; for py in {python} python3; do command -v \"$py\" >/dev/null || continue; "
            f'add=$(PYTHONPATH={root}${{PYTHONPATH:+:$PYTHONPATH}} "$py" '
            '-m source_code.launch.site_step "$@"); s=$?; [ $s -lt 126 ] && break; done; '
            '[ $s = 2 ] && return 2; '
            '[ $s = 3 ] && { eval "command sbatch $add"; return; }; [ $s = 0 ] || add=; '
            f'[ $s -ge 126 ] && echo "note: the site step\'s partition check could not start ({python}, '
            'then python3: exit $s): the job goes to sbatch unchecked; load a Python 3.10 or newer and run '
            'the site step again in this shell" >&2; '
            'command sbatch $add "$@"; }')


def check_submission(argv: list[str], env: dict, cwd: Path) -> str | None:
    """The one-line refusal of a job its partition cannot take (None: let sbatch decide)."""
    try:
        site = load(env.get("WORKSHOP_SITE", ""))
    except ProfileError:
        return None
    options, script = job_script(argv, cwd)
    given, in_script = read_options(options), script_options(script) if script else {}
    part = given.get("partition") or env.get("SBATCH_PARTITION") or in_script.get("partition")
    nodes = re.match(r"\d+", given.get("nodes") or in_script.get("nodes") or "")
    time = given.get("time") or env.get("SBATCH_TIMELIMIT") or in_script.get("time")
    limit = next(((most, longest) for name, most, longest in site.limits if name == part), None)
    if not part or "," in part or not nodes or limit is None:
        return None
    try:
        asked = minutes(time) if time else None
    except ProfileError:
        asked = None                                # not a Slurm time: sbatch says so itself
    count, (most, longest) = int(nodes.group()), limit
    per, cap = gpus_a_node(given, env, in_script), dict(site.gpu_limits).get(part)
    fits = count <= most and (asked is None or asked <= minutes(longest))
    if fits and (cap is None or count * per <= cap):
        return None
    if fits:                                        # Roihu's gpumedium: GPUs a job in all
        fewer = f"the site step with --gpus-per-node {cap // count} ({count} x {cap // count}), " \
            if cap // count else ""
        return (f"error: {site.name}'s partition {part} takes at most {cap} GPU(s) a job, on 1 to {most} "
                f"node(s); this job asks for {count} node(s) x {per} GPU(s) = {count * per}: not submitted; "
                f"{fewer}a course reservation in a partition that takes it, or the site step with --test "
                f"({site.partition_test})")
    whole = site.partition_full_nodes
    if part == site.partition_test != site.partition:
        fix = f"sbatch --partition={site.partition}, or the site step without --test"
    elif count > most and part == site.partition != whole and site.partition_max_gpus >= site.gpus_per_node:
        fix = (f"a course reservation in a partition that takes it, or the site step with --test "
               f"({site.partition_test})")           # Roihu: gpumedium takes 4 GPUs a job in all
    elif count > most and part == site.partition != whole:
        fix = f"the site step with --gpus-per-node {site.gpus_per_node} picks {whole}"
    elif count <= most:
        fix = f"ask for {human(minutes(longest))} at most (sbatch --time=...)"
    else:
        fix = "sbatch --partition=<another> (the site's partitions: site_profiles --list)"
    return (f"error: {site.name}'s partition {part} takes at most {most} node(s) for "
            f"{human(minutes(longest))}; this job asks for {count} node(s)"
            f"{f' for {human(asked)}' if asked else ''}: not submitted; {fix}{guessed(site, part)}")


def try_line(step: str, line: list[str], env: dict, cwd=None) -> tuple[int, str, bool]:
    """(exit status, what it said, whether it reached sbatch) of ``line`` typed in a bash after
    the site step ``step`` (its options), with an sbatch on PATH that only says it was reached,
    and with which options (``sbatch reached: submitted (OPTIONS SCRIPT)``)."""
    with tempfile.TemporaryDirectory(prefix="site-step-") as stub:
        Path(stub, "sbatch").write_text("#!/bin/sh\necho \"sbatch reached: submitted ($*)\"\n")
        os.chmod(Path(stub, "sbatch"), 0o755)
        step_line = (f'eval "$({shlex.quote(sys.executable)} -m source_code.launch.site_profiles {step} '
                     '--format exports 2>/dev/null)"')
        done = subprocess.run(["bash", "-c", f"{step_line} && {shlex.join(line)}"], capture_output=True,
                              text=True, cwd=cwd, env={**env, "PATH": f"{stub}:{env.get('PATH', '')}"})
    return done.returncode, (done.stderr + done.stdout).strip(), "sbatch reached" in done.stdout


def main(argv=None) -> int:
    """Exit status 2 with the refusal on stderr; 3 with the whole line to submit instead on stdout
    (shell words) and why on stderr; else 0, the options to add on stdout (the function passes
    them to sbatch) and what they are on stderr."""
    argv = sys.argv[1:] if argv is None else argv
    said = check_submission(argv, os.environ, Path.cwd())
    if said:
        print(said, file=sys.stderr)
        return 2
    add, note = cores_option(argv, os.environ, Path.cwd())
    wrapped, why = in_site_container(argv, os.environ, Path(__file__).resolve().parents[2])
    if wrapped:
        print(why, file=sys.stderr)
        print(shlex.join(add + wrapped))
        return 3
    if add:
        print(note, file=sys.stderr)
        print(" ".join(add))
    return 0


def summary(pairs: list[tuple[str, str]]) -> str:
    """What the step did, for the terminal (stderr: eval does not swallow it)."""
    d = dict(pairs)
    what = ", ".join(f"{k.removeprefix('SBATCH_').lower()} {v}" for k, v in pairs if k != "WORKSHOP_SITE")
    hint = "" if "SBATCH_ACCOUNT" in d or d["WORKSHOP_SITE"].startswith("local") else \
        "; no --account given: sbatch will need one (SBATCH_ACCOUNT)"
    return f"site {d['WORKSHOP_SITE']} set up for sbatch in this shell: {what}{hint}"


def after_step(options: str, env: dict, cwd=None) -> tuple[dict, str]:
    """Run the site step, eval "$(python -m source_code.launch.site_profiles OPTIONS --format
    exports)", in a bash with ``env``: what it leaves set there (SBATCH_*, WORKSHOP_SITE, unset
    ones gone) and the line it says. A refused step leaves the shell as it was: ({}, its error)."""
    step = f'eval "$({shlex.quote(sys.executable)} -m source_code.launch.site_profiles {options} --format exports)"'
    done = subprocess.run(["bash", "-c", f"{step} && env -0"], capture_output=True, text=True, cwd=cwd, env=env)
    left = dict(kv.split("=", 1) for kv in done.stdout.split("\0") if kv.startswith(("SBATCH_", "WORKSHOP_SITE=")))
    return (left if done.returncode == 0 else {}), done.stderr.strip()


if __name__ == "__main__":
    sys.exit(main())
