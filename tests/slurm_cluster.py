"""A real two-node Slurm cluster on this one machine, for the tests (and by hand).

    sudo .venv/bin/python tests/slurm_cluster.py start     # install if needed, start, wait for idle
    sudo .venv/bin/python tests/slurm_cluster.py stop

What it starts (as root, no systemd needed):
* munged (only if none answers yet; stopped again only if we started it);
* slurmctld in the machine's own namespaces;
* two slurmd, nodes ``n1`` and ``n2``, each in its own UTS namespace (so ``hostname`` says n1 or
  n2: torchrun's c10d rendezvous decides which node hosts the store by comparing host names)
  and its own mount namespace. Both share the host network; each slurmd listens on its own
  port and its node name resolves to its own loopback address (127.0.1.1 / 127.0.1.2).

Partition ``debug``, 2 CPUs and 8000 MB per node, no GPUs: the ``local`` site profile.
State, logs and pid files live in a directory under /tmp, never in the repository.
Jobs are submitted and polled with source_code.launch.jobs (every 0.5 s, not ``sbatch --wait``).
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run by hand: the repository
from source_code.launch.jobs import LOCAL_CLUSTER_MARK as MARK  # noqa: E402

NODES = {"n1": ("127.0.1.1", 17001), "n2": ("127.0.1.2", 17002)}
CONF = Path("/etc/slurm/slurm.conf")
GRES_CONF = CONF.parent / "gres.conf"
PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge"]
DEFAULT_BASE = Path("/tmp/workshop-slurm")


class ClusterUnavailable(RuntimeError):
    """Slurm cannot run here (not root, no unshare, foreign slurm.conf, install failed)."""


def _run(cmd, check=True, **kw):
    return subprocess.run(cmd, check=check, text=True, capture_output=True, **kw)


def _say(msg):
    print(f"[slurm_cluster] {msg}", file=sys.stderr, flush=True)


def why_not_possible() -> str | None:
    """None when this machine can host the cluster, else the reason (for a skip)."""
    if os.name != "posix" or os.geteuid() != 0:
        return "the local Slurm cluster needs root (it installs packages and starts daemons)"
    if not shutil.which("unshare"):
        return "unshare (util-linux) is missing: each slurmd needs its own UTS namespace"
    res = subprocess.run(["unshare", "--uts", "--mount", "true"], capture_output=True, text=True)
    if res.returncode != 0:
        return f"cannot create UTS/mount namespaces here: {res.stderr.strip()}"
    if CONF.exists() and MARK not in CONF.read_text():
        return f"{CONF} exists and was not written by this harness: refusing to replace it"
    if not all(shutil.which(p) for p in ("slurmctld", "slurmd", "sbatch", "munged")) \
            and not shutil.which("apt-get"):
        return "Slurm is not installed and apt-get is not available to install it"
    return None


def install() -> None:
    if all(shutil.which(p) for p in ("slurmctld", "slurmd", "sbatch", "munged")):
        return
    _say("installing " + " ".join(PACKAGES))
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    _run(["apt-get", "update", "-qq"], env=env)
    res = subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES],
                         env=env, capture_output=True, text=True)
    if res.returncode != 0:  # postinst "policy-rc.d denied execution of start" is harmless
        raise ClusterUnavailable(f"apt-get install failed: {res.stderr.strip()[-400:]}")


def _munge_ok() -> bool:
    p = subprocess.run("munge -n | unmunge", shell=True, capture_output=True)
    return p.returncode == 0


def _hosts() -> None:
    """Node names must resolve: MASTER_ADDR=$(scontrol show hostnames ...) gives n1."""
    text = Path("/etc/hosts").read_text()
    add = [f"{ip} {name}" for name, (ip, _) in NODES.items()
           if not re.search(rf"^{re.escape(ip)}\s+{name}\s*$", text, re.M)]
    if add:
        with open("/etc/hosts", "a") as f:
            f.write("".join(line + "\n" for line in add))


def slurm_conf(base: Path, cpus: int, mem_mb: int) -> str:
    nodes = "\n".join(f"NodeName={n} NodeAddr={ip} Port={port} CPUs={cpus} RealMemory={mem_mb} Gres=gpu:{cpus} "
                      "State=UNKNOWN" for n, (ip, port) in NODES.items())
    return f"""{MARK}; state in {base}
ClusterName=workshop
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# a requeued job starts again only once its credential has expired (default 120 s): 15 s keeps
# the requeue test short and still leaves steps time to launch on a busy 2-core machine
AuthInfo=cred_expire=15
SlurmctldPort=6817
StateSaveLocation={base}/state/ctld
SlurmdSpoolDir={base}/state/slurmd-%n
SlurmctldPidFile={base}/run/slurmctld.pid
SlurmdPidFile={base}/run/slurmd-%n.pid
SlurmctldLogFile={base}/log/slurmctld.log
SlurmdLogFile={base}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# a requeued job waits for its begin time, then for the next scheduling pass (default every 60 s);
# a job that ends frees its node for the next at once, not after up to 3 s (batch_sched_delay):
# the tests submit dozens of short jobs one after another
SchedulerParameters=sched_interval=5,bf_interval=5,batch_sched_delay=0,sched_min_interval=0
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MailProg=/bin/true
# more CPUs than the machine has may be declared (SLURM_NODE_CPUS): config_overrides
SlurmdParameters=config_overrides
# two slurmd on one host: NO CommunicationParameters=NoInAddrAny, a distinct Port each
# each node declares as many GPUs as it has CPUs, as generic resources (gres.conf: device files
# made for the purpose, no GPU behind them): the `local-gpu` profile asks for them as a GPU
# site's jobs must, and a job that asks for none gets none
GresTypes=gpu
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
# where a course's reservation is made (the site step then submits into it, not into debug)
PartitionName=course Nodes=ALL Default=NO MaxTime=INFINITE State=UP
"""


def gres_conf(base: Path, gpus: int) -> str:
    """GPUs that Slurm hands out as it would real ones, with no GPU behind them: Slurm 22.05's
    gpu plugin drops a GPU without a device file ("Removing file-less GPU"), so each node's GPUs
    are character devices made for the purpose (<base>/dev/gpuN, the same device as /dev/null:
    nothing opens them). Jobs get SLURM_GPUS_ON_NODE, SLURM_JOB_GPUS and CUDA_VISIBLE_DEVICES
    as on a GPU site; no detection runs (AutoDetect=off)."""
    files = f"{base}/dev/gpu[0-{gpus - 1}]" if gpus > 1 else f"{base}/dev/gpu0"
    return (f"{MARK}\nAutoDetect=off\n"
            + "".join(f"NodeName={n} Name=gpu File={files}\n" for n in NODES))


def _gpu_devices(base: Path, gpus: int) -> None:
    (base / "dev").mkdir(parents=True, exist_ok=True)
    for i in range(gpus):
        dev = base / "dev" / f"gpu{i}"
        if not dev.is_char_device():
            dev.unlink(missing_ok=True)
            os.mknod(dev, 0o644 | stat.S_IFCHR, os.makedev(1, 3))


def idle_nodes() -> int:
    """Nodes that are idle (each once, though sinfo lists a node once per partition)."""
    res = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True)
    return len({ln.split()[0] for ln in res.stdout.splitlines() if ln.split()[-1:] == ["idle"]})


def is_running() -> bool:
    return shutil.which("sinfo") is not None and idle_nodes() + _busy_nodes() == len(NODES)


def _busy_nodes() -> int:
    res = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True)
    return len({ln.split()[0] for ln in res.stdout.splitlines() if ln.split()[-1:] in (["alloc"], ["mix"], ["comp"])})


def start(base: Path = DEFAULT_BASE, cpus: int | None = None, mem_mb: int = 8000,
          timeout: float = 60) -> Path:
    """Install if needed, (re)start ctld + n1 + n2, wait until both nodes are idle."""
    reason = why_not_possible()
    if reason:
        raise ClusterUnavailable(reason)
    t0 = time.time()
    install()
    cpus = cpus or int(os.environ.get("SLURM_NODE_CPUS", 2))
    stop(base, quiet=True, keep_munge=True)   # a munged stopping now would still answer below
    _hosts()
    if not _munge_ok():
        Path("/run/munge").mkdir(exist_ok=True)
        shutil.chown("/run/munge", "munge", "munge")
        _run(["runuser", "-u", "munge", "--", "/usr/sbin/munged"])
        for _ in range(50):
            if _munge_ok():
                break
            time.sleep(0.1)
        (base / "run").mkdir(parents=True, exist_ok=True)
        (base / "run" / "we-started-munged").write_text(Path("/run/munge/munged.pid").read_text())
    if not _munge_ok():
        raise ClusterUnavailable("munged does not answer (munge -n | unmunge fails)")
    for sub in ("state", "log"):
        shutil.rmtree(base / sub, ignore_errors=True)
    for d in ["state/ctld", "log", "run"] + [f"state/slurmd-{n}" for n in NODES]:
        (base / d).mkdir(parents=True, exist_ok=True)
    CONF.parent.mkdir(parents=True, exist_ok=True)
    CONF.write_text(slurm_conf(base, cpus, mem_mb))
    _gpu_devices(base, cpus)
    GRES_CONF.write_text(gres_conf(base, cpus))
    _run(["/usr/sbin/slurmctld", "-i"])
    for n in NODES:
        # own hostname (UTS) and own mounts; the network stays shared (loopback aliases)
        _run(["unshare", "--uts", "--mount", "--propagation", "private", "sh", "-c",
              f"hostname {n} && exec /usr/sbin/slurmd -N {n}"])
    while time.time() - t0 < timeout:
        if idle_nodes() == len(NODES):
            _say(f"cluster up in {time.time() - t0:.1f} s: nodes {' '.join(NODES)}, "
                 f"{cpus} CPUs each, state in {base}")
            return base
        time.sleep(0.5)
    logs = "\n".join(p.read_text()[-800:] for p in sorted((base / "log").glob("*.log")))
    stop(base, quiet=True)
    raise ClusterUnavailable(f"nodes not idle after {timeout:.0f} s; logs:\n{logs}")


def _pids(base: Path) -> list[int]:
    out = []
    for f in (base / "run").glob("*.pid"):
        try:
            out.append(int(f.read_text().split()[0]))
        except (ValueError, IndexError):
            pass
    return out


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def stop(base: Path = DEFAULT_BASE, quiet: bool = False, keep_munge: bool = False) -> None:
    """Cancel jobs, TERM the daemons named in our pid files (never by name), KILL leftovers;
    munged too where we started it, unless ``keep_munge`` (a restart)."""
    if not (base / "run").exists():
        return
    if shutil.which("squeue") and any(_alive(p) for p in _pids(base)):
        jobs = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True,
                              timeout=10).stdout.split()
        if jobs:
            subprocess.run(["scancel", *jobs], capture_output=True)
            time.sleep(1)
    pids = _pids(base)
    marker = base / "run" / "we-started-munged"
    if marker.exists() and not keep_munge:
        pids.append(int(marker.read_text().split()[0]))
    for p in pids:
        try:
            os.kill(p, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.time() + 20
    while time.time() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.2)
    for p in pids:
        if _alive(p):
            os.kill(p, signal.SIGKILL)
    for f in (base / "run").glob("*.pid"):
        f.unlink()
    if not keep_munge:
        marker.unlink(missing_ok=True)
    if not quiet:
        _say(f"stopped {len(pids)} daemons")


# ------------------------------------------------------------------ one cluster, several users
# Several pytest processes may want the cluster at once (pytest-xdist workers, two developers'
# runs on one machine): each ``acquire``s it and ``release``s it when done; the first starts it
# (or takes over one already running with the same configuration), the last one stops it.
# A user is a file named after its pid in <base>/users; files of dead processes do not count.
def _users(base: Path) -> list[int]:
    live = []
    for f in (base / "users").glob("*"):
        pid = int(f.name) if f.name.isdigit() else -1
        if pid > 0 and _alive(pid):
            live.append(pid)
        else:
            f.unlink(missing_ok=True)
    return live


def acquire(base: Path = DEFAULT_BASE, **kw) -> Path:
    """Start the cluster unless it already runs with this configuration; count this process in."""
    import fcntl
    base.mkdir(parents=True, exist_ok=True)
    with open(base / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cpus = kw.get("cpus") or int(os.environ.get("SLURM_NODE_CPUS", 2))
        wanted = slurm_conf(base, cpus, kw.get("mem_mb", 8000))
        same = CONF.exists() and CONF.read_text() == wanted
        others = [p for p in _users(base) if p != os.getpid()]
        if not (same and is_running()) and not (others and is_running()):
            start(base, **kw)
        (base / "users").mkdir(exist_ok=True)
        (base / "users" / str(os.getpid())).touch()
    return base


def release(base: Path = DEFAULT_BASE) -> None:
    """Count this process out; the last user stops the cluster."""
    import fcntl
    with open(base / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        (base / "users" / str(os.getpid())).unlink(missing_ok=True)
        if not _users(base):
            stop(base)


# jobs: submit + poll helpers live in the package (notebook 06 uses them too)
from source_code.launch.jobs import Job, job_info, run_job, sbatch, wait  # noqa: E402,F401


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else "start"
    if cmd == "start":
        start()
        print(subprocess.run(["sinfo", "-N"], capture_output=True, text=True).stdout)
    elif cmd == "stop":
        stop()
    else:
        sys.exit("usage: slurm_cluster.py start|stop")
