"""The resource calculator: the right #SBATCH lines for a site and a number of GPUs.

    python -m source_code.launch.site_profiles --site lumi --gpus 16
    python -m source_code.launch.site_profiles --site jureca --gpus 2 --launcher srun
    python -m source_code.launch.site_profiles --site roihu --gpus 4 --test --time 00:10:00
    sbatch $(python -m source_code.launch.site_profiles --site lumi --gpus 16 --format args) slurm/ddp_multinode.slurm
    python -m source_code.launch.site_profiles --list
    eval "$(python -m source_code.launch.site_profiles --site lumi --account project_X --format exports)"

The last line is the site step (site_step.py): once per shell, then the bare job lines
(`sbatch slurm/ddp_multinode.slurm`) ask for the site's partition, GPUs, memory and account.

The site profiles are the shell files slurm/sites/<site>.sh (the job scripts source them for
their module lines and interconnect variables); this module reads their SITE_* values.

Rules of thumb it applies:
* whole nodes when the job needs more GPUs than a node has: the GPU count must then be a
  multiple of the GPUs per node;
* the partition follows the GPU count: up to SITE_PARTITION_MAX_GPUS in SITE_PARTITION (Roihu's
  gpumedium takes 1-4 GPUs, LUMI's small-g partial nodes), larger jobs in
  SITE_PARTITION_FULL_NODES; --test: the site's partition for short runs, within its limits;
* each GPU gets the same share of the node's CPU cores and memory as it has of the node's
  GPUs (capped by the site: on LUMI at most 7 cores and 60 GB per GCD);
* torchrun layout: one task per node holding all its GPUs' cores, torchrun starts the
  processes; srun layout: one task per GPU with its share of cores;
* no account in the header unless --account is given: sbatch reads SBATCH_ACCOUNT.
"""
from __future__ import annotations

import argparse
import math
import shlex
from dataclasses import dataclass
from pathlib import Path

SITES_DIR = Path(__file__).resolve().parents[2] / "slurm" / "sites"


class ProfileError(SystemExit):
    """Bad site or GPU count: one line, exit status 2."""

    def __init__(self, message: str):
        super().__init__(2)
        self.message = message

    def __str__(self):
        return self.message


@dataclass(frozen=True)
class Site:
    key: str
    name: str
    partition: str
    partition_max_gpus: int
    partition_full_nodes: str
    partition_test: str
    test_max_gpus: int
    test_max_minutes: int
    gpus_per_node: int
    gpu_request: str  # e.g. "--gres=gpu:v100:{n}", "--gpus-per-node={n}", "" (no GPUs)
    cpus_per_node: int
    mem_per_node_gb: int
    max_cpus_per_gpu: int
    max_mem_per_gpu_gb: int  # host memory; with mem_per_node_gb == 0: no --mem line (whole nodes)
    environment: str  # the body of site_environment(): module lines, interconnect variables
    limits: tuple = ()  # (partition, max nodes, max time) from SITE_LIMITS
    retired: str = ""  # SITE_RETIRED: why no course goes there any more (a worked example only)
    gpu_limits: tuple = ()  # (partition, max GPUs a job): SITE_LIMITS' third field, where it has one
    gpu_mem_gb: int = 0  # SITE_GPU_MEM_GB: the GPU's own memory (HBM), not in max_mem_per_gpu_gb
    full_nodes_requires: str = ""  # SITE_PARTITION_FULL_NODES_REQUIRES: who may use that partition
    limits_guessed: bool = False  # SITE_LIMITS_GUESSED=yes: SITE_LIMITS not from the site's guide

    @property
    def cpus_per_gpu(self) -> int:
        return max(1, min(self.cpus_per_node // self.gpus_per_node, self.max_cpus_per_gpu))

    @property
    def mem_per_gpu_gb(self) -> int:
        if not self.mem_per_node_gb:
            return self.max_mem_per_gpu_gb
        return max(1, min(self.mem_per_node_gb // self.gpus_per_node, self.max_mem_per_gpu_gb))


def sites() -> list[str]:
    return sorted(p.stem for p in SITES_DIR.glob("*.sh"))


def load(key: str) -> Site:
    path = SITES_DIR / f"{key}.sh"
    if not path.exists():
        raise ProfileError(f"error: unknown site {key!r}; choose one of: {', '.join(sites())}")
    text = path.read_text()
    values = {}
    for line in text.splitlines():
        if line.startswith("SITE_") and "=" in line:
            k, v = line.split("=", 1)
            values[k] = (shlex.split(v, comments=True) or [""])[0]
    body = text.split("site_environment() {", 1)[1].rsplit("}", 1)[0]
    env = "\n".join(ln[4:] if ln.startswith("    ") else ln for ln in body.strip("\n").splitlines())
    partition = values["SITE_PARTITION"]
    # SITE_LIMITS: partition=max nodes/max time[/max GPUs a job]
    limits = [(part, rest.split("/")) for part, _, rest in
              (item.partition("=") for item in values.get("SITE_LIMITS", "").split())]
    return Site(key, values["SITE_NAME"], partition,
                int(values.get("SITE_PARTITION_MAX_GPUS", values["SITE_GPUS_PER_NODE"])),
                values.get("SITE_PARTITION_FULL_NODES", partition),
                values.get("SITE_PARTITION_TEST", partition),
                int(values.get("SITE_TEST_MAX_GPUS", values["SITE_GPUS_PER_NODE"])),
                int(values.get("SITE_TEST_MAX_MINUTES", 15)),
                int(values["SITE_GPUS_PER_NODE"]), values["SITE_GPU_REQUEST"],
                int(values["SITE_CPUS_PER_NODE"]), int(values["SITE_MEM_PER_NODE_GB"]),
                int(values["SITE_MAX_CPUS_PER_GPU"]), int(values["SITE_MAX_MEM_PER_GPU_GB"]), env,
                tuple((part, int(fields[0]), fields[1]) for part, fields in limits),
                values.get("SITE_RETIRED", ""),
                tuple((part, int(fields[2])) for part, fields in limits if len(fields) > 2),
                int(values.get("SITE_GPU_MEM_GB", 0)), values.get("SITE_PARTITION_FULL_NODES_REQUIRES", ""),
                values.get("SITE_LIMITS_GUESSED", "") == "yes")


def guessed(site: Site, part: str) -> str:
    """The words a refusal adds when the partition's limits are the profile's guess."""
    return (f" (these limits are the profile's guess: scontrol show partition {part} on the site "
            "gives the real ones)") if site.limits_guessed else ""


def current_sites() -> list[str]:
    """The sites a course can run on: no test cluster, no retired system."""
    return [key for key in sites() if not key.startswith("local") and not load(key).retired]


def check_limits(site: Site, part: str, nodes: int, time: str, gpus: int | None = None) -> None:
    """Refuse, in one line, a job larger or longer than ``part`` allows (SITE_LIMITS): its
    nodes, its time and, where the partition caps them (Roihu's gpumedium), its GPUs in all."""
    for name, max_nodes, max_time in site.limits:
        if name == part and (nodes > max_nodes or minutes(time) > minutes(max_time)):
            raise ProfileError(f"error: {site.name}'s partition {part} takes at most {max_nodes} "
                               f"node(s) for {human(minutes(max_time))}; this asks for {nodes} "
                               f"node(s) for {human(minutes(time))}: ask for fewer GPUs or less "
                               f"time, or another partition{guessed(site, part)}")
    most = dict(site.gpu_limits).get(part)
    if gpus is not None and most is not None and gpus > most:
        raise ProfileError(f"error: {site.name}'s partition {part} takes at most {most} GPU(s) a job; "
                           f"this asks for {gpus}: ask for fewer GPUs, or another partition")


def human(total_minutes: float) -> str:
    """Minutes as a person says them: '15 min', '36 h', '3 days'."""
    for unit, size in (("days", 24 * 60), ("h", 60)):
        if total_minutes >= size and total_minutes % size == 0:
            n = int(total_minutes // size)
            return f"{n} {'day' if unit == 'days' and n == 1 else unit}"
    return f"{total_minutes:g} min"


def layout(site: Site, gpus: int) -> tuple[int, int]:
    """(nodes, GPUs per node) for ``gpus`` GPUs, or a one-line error."""
    if gpus < 1:
        raise ProfileError("error: --gpus must be at least 1")
    per = site.gpus_per_node
    if gpus <= per:
        return 1, gpus
    if gpus % per:
        lower, upper = (gpus // per) * per, math.ceil(gpus / per) * per
        raise ProfileError(f"error: {gpus} GPUs do not fill whole {site.name} nodes of {per} "
                           f"GPUs; use {lower} or {upper}")
    return gpus // per, per


def minutes(time: str) -> float:
    """Slurm's time formats (m, m:s, h:m:s, d-h, d-h:m, d-h:m:s) in minutes."""
    try:
        days, _, rest = time.rpartition("-")
        parts = [int(x) for x in rest.split(":")]
        if days:
            h, m, sec = (parts + [0, 0])[:3] if len(parts) <= 3 else (None, None, None)
        else:
            h, m, sec = {1: (0, parts[0], 0), 2: (0, *parts), 3: tuple(parts)}.get(len(parts), (None,) * 3)
        if h is None or min(parts) < 0:
            raise ValueError
        total = (int(days or 0) * 24 + h) * 60 + m + sec / 60
    except ValueError:
        raise ProfileError(f"error: --time {time!r} is not a Slurm time ([days-]hh:mm:ss)") from None
    if total <= 0:
        raise ProfileError(f"error: --time {time!r} must be longer than zero")
    return total


def partition(site: Site, gpus: int, test: bool = False, time: str = "00:30:00") -> tuple[str, str]:
    """(partition, why) for ``gpus`` GPUs; --test runs must fit the test partition's limits."""
    if test:
        if gpus > site.test_max_gpus or minutes(time) > site.test_max_minutes:
            raise ProfileError(f"error: {site.name}'s test partition {site.partition_test} takes at most "
                               f"{site.test_max_gpus} GPUs for {site.test_max_minutes} min; "
                               f"drop --test or ask for less{guessed(site, site.partition_test)}")
        return site.partition_test, f"short test run (at most {site.test_max_minutes} min)"
    if gpus <= site.partition_max_gpus or site.partition_full_nodes == site.partition:
        return site.partition, site.name if gpus > site.partition_max_gpus or \
            site.partition_full_nodes == site.partition else f"up to {site.partition_max_gpus} GPUs"
    if gpus % site.gpus_per_node:
        lower, upper = site.partition_max_gpus, math.ceil(gpus / site.gpus_per_node) * site.gpus_per_node
        raise ProfileError(f"error: {site.name}'s {site.partition_full_nodes} takes whole nodes of "
                           f"{site.gpus_per_node} GPUs; use {lower} or {upper}")
    only = f"; only {site.full_nodes_requires}" if site.full_nodes_requires else ""
    return site.partition_full_nodes, f"more than {site.partition_max_gpus} GPUs: whole nodes{only}"


def sbatch_options(key: str, gpus: int, launcher: str = "torchrun", time: str = "00:30:00",
                   account: str | None = None, test: bool = False) -> list[tuple[str, str]]:
    """The options as (flag, why) pairs, in the order they are printed."""
    site = load(key)
    nodes, per_node = layout(site, gpus)
    minutes(time)
    part, why = partition(site, gpus, test, time)
    check_limits(site, part, nodes, time, gpus)
    opts = [(f"--partition={part}", why)]
    if account:
        opts.append((f"--account={account}", "billing project"))
    opts.append((f"--nodes={nodes}", f"{gpus} GPUs = {nodes} x {per_node}"))
    cpus = site.cpus_per_gpu
    if launcher == "torchrun":
        opts += [("--ntasks-per-node=1", "one torchrun per node; it starts the processes"),
                 (f"--cpus-per-task={cpus * per_node}", f"{cpus} cores per GPU")]
    elif launcher == "srun":
        opts += [(f"--ntasks-per-node={per_node}", "one task (process) per GPU"),
                 (f"--cpus-per-task={cpus}", f"{cpus} cores per GPU")]
    else:
        raise ProfileError(f"error: --launcher {launcher!r}: choose torchrun or srun")
    if site.gpu_request:
        opts.append((site.gpu_request.format(n=per_node), f"{per_node} GPUs on each node"))
    if site.mem_per_node_gb:  # G = GiB for Slurm
        opts.append((f"--mem={site.mem_per_gpu_gb * per_node}G", f"{site.mem_per_gpu_gb} GiB per GPU"))
    opts.append((f"--time={time}", "wall-clock limit"))
    # the job scripts source slurm/sites/<site>.sh (module lines, interconnect variables)
    opts.append((f"--export=ALL,WORKSHOP_SITE={key}", f"job scripts load slurm/sites/{key}.sh"))
    return opts


def header(key: str, gpus: int, launcher: str = "torchrun", time: str = "00:30:00",
           account: str | None = None, test: bool = False) -> str:
    opts = sbatch_options(key, gpus, launcher, time, account, test)
    width = max(len(o) for o, _ in opts) + 9
    lines = [f"#SBATCH {o}".ljust(width) + f"  # {why}" for o, why in opts]
    if not account:
        lines.append("# account: export SBATCH_ACCOUNT=<your project> before sbatch (or pass --account)")
    return "\n".join(lines)


def args(key: str, gpus: int, launcher: str = "torchrun", time: str = "00:30:00",
         account: str | None = None, test: bool = False) -> list[str]:
    """The same as sbatch command-line options (they override the script's #SBATCH lines)."""
    return [o for o, _ in sbatch_options(key, gpus, launcher, time, account, test)]


def table(gpus: int) -> list[dict]:
    """One row per site: the layout of ``gpus`` GPUs (used by the launching notebook), or the
    one-line error the calculator gives (whole nodes, the partition's node and time limits)."""
    rows = []
    for key in sites():
        site = load(key)
        try:
            nodes, per_node = layout(site, gpus)
            sbatch_options(key, gpus)              # the partition's limits, as sbatch lines get them
        except ProfileError as err:
            rows.append({"site": key, "error": err.message})
            continue
        part = partition(site, gpus)[0]
        rows.append({"site": key, "nodes": nodes, "gpus_per_node": per_node, "partition": part,
                     "requires": site.full_nodes_requires if part == site.partition_full_nodes else "",
                     "cpus_per_gpu": site.cpus_per_gpu, "mem_per_gpu_gb": site.mem_per_gpu_gb,
                     "gpu_mem_gb": site.gpu_mem_gb})
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--site", help=f"one of the profiles in {SITES_DIR}")
    p.add_argument("--gpus", type=int, default=None, help="GPUs in total (default: one node's)")
    p.add_argument("--launcher", default="torchrun", help="torchrun (a task per node) | srun (a task per GPU)")
    p.add_argument("--time", default=None, help="wall-clock limit (default: 00:30:00; exports: "
                   "each job script's own)")
    p.add_argument("--account", default=None, help="billing project (default: SBATCH_ACCOUNT)")
    p.add_argument("--test", action="store_true", help="the site's partition for short test runs")
    p.add_argument("--format", default="header", choices=["header", "args", "env", "exports"],
                   help="header: #SBATCH lines; args: sbatch options; env: the site's module lines; "
                        "exports: the site step, for eval in the shell you submit from")
    p.add_argument("--gpus-per-node", type=int, default=None,
                   help="exports: GPUs each node of a job asks for (default: the whole node's)")
    p.add_argument("--reservation", default=None, help="exports: a course's reservation; its "
                   "partition, where it has one, replaces the profile's")
    p.add_argument("--partition", default=None, help="exports: this partition instead of the profile's")
    p.add_argument("--list", action="store_true", help="list the sites")
    a = p.parse_args(argv)
    try:
        if a.list:
            for key in sites():
                s = load(key)
                print(f"{key:9s} {s.name}: {s.gpus_per_node} GPUs/node, partition {s.partition}"
                      + (f" (retired: {s.retired})" if s.retired else ""))
            return 0
        if not a.site:
            raise ProfileError(f"error: --site is required; one of: {', '.join(sites())}")
        if a.gpus is not None and a.gpus < 1:  # 0 is not "the default": say what it would mean
            raise ProfileError(f"error: --gpus {a.gpus}: these headers are for GPU jobs; give 1 or more "
                               "GPUs, or leave --gpus out for one full node (CPU-only runs need no "
                               "GPU request: e.g. sbatch --nodes=1 --ntasks-per-node=1 with WORKSHOP_DEVICE=cpu)")
        if a.format == "exports":
            from source_code.launch import site_step
            pairs = site_step.exports(a.site, a.account, a.gpus_per_node, a.time, a.reservation,
                                      a.partition, a.test)
            print(site_step.shell_lines(pairs))
            print(site_step.summary(pairs), file=__import__("sys").stderr)
            if load(a.site).retired:   # a worked example: said, since its jobs would go nowhere
                print(f"note: {load(a.site).name} is retired ({load(a.site).retired})", file=__import__("sys").stderr)
            return 0
        a.time = a.time or "00:30:00"
        gpus = a.gpus if a.gpus is not None else load(a.site).gpus_per_node
        if a.format == "header":
            print(header(a.site, gpus, a.launcher, a.time, a.account, a.test))
        elif a.format == "args":
            print(" ".join(shlex.quote(x) for x in args(a.site, gpus, a.launcher, a.time, a.account, a.test)))
        else:
            print(load(a.site).environment)
    except SystemExit as err:  # ProfileError, also of this module imported anew under -m
        if not hasattr(err, "message"):
            raise
        print(err.message, file=__import__("sys").stderr)
        return 2
    return 0


if __name__ == "__main__":
    from source_code.errors import run_main   # a LaunchError: its one line, exit status 2
    run_main(main)
