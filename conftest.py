"""The suite's time report (here, at the root, so that the notebooks' cells are counted too:
hooks of tests/conftest.py see only the tests under tests/).

Beside each file's wall time it gives its CPU time: the CPU seconds of the pytest process that
ran it and of every process it started (torchrun and its workers, the notebook's kernel and what
that starts; for the Slurm tests and notebook 06 also the jobs, which the local cluster's
daemons start). A file whose CPU time is far below its wall time spends that time waiting.
With pytest-xdist each worker measures its own tests and the report is made from all of them.
"""
from __future__ import annotations

import json
import os
import sys
from datetime import datetime
from pathlib import Path

import pytest

try:
    import psutil
except ImportError:  # the report then counts the pytest process and what it reaped only
    psutil = None

# ------------------------------------------------------------ the threads of the suite's processes
# The suite runs its workers, their notebooks' kernels and the Slurm jobs on a few cores at once.
# Each process gets one OpenMP thread, as torchrun gives its workers, and an OpenMP thread that
# waits sleeps instead of spinning: on 2 busy cores, a kernel's second thread spinning for a
# descheduled peer cost up to 6 times the CPU of the same work (notebook 08's optimizer
# comparison: 15 CPU-s with 2 threads instead of 2.4 with 1, beside two busy loops; 3.2 with 2
# threads that sleep when they wait). A cell that sets its own thread count keeps it. Set either
# variable before the run to run otherwise. Set here, before torch loads anywhere in the suite;
# the workers, kernels, launches and jobs inherit them.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


# ------------------------------------------------------------------------- the order of the work
def _stored_run_seconds(path: Path) -> float:
    """What a notebook's stored cells took when it was last executed."""
    total = 0.0
    for cell in json.loads(path.read_text()).get("cells", []):
        ex = cell.get("metadata", {}).get("execution", {})
        if "iopub.execute_input" in ex and "shell.execute_reply" in ex:
            t0, t1 = (datetime.fromisoformat(ex[k].rstrip("Z")) for k in ("iopub.execute_input", "shell.execute_reply"))
            total += (t1 - t0).total_seconds()
    return total


def _uses_the_cluster(item) -> bool:
    return bool(item.get_closest_marker("slurm")) or "cluster" in getattr(item, "fixturenames", ())


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Longest work first, so that parallel workers end together: the files that submit Slurm
    jobs, then the notebooks by their stored run time, then the other test files. Each file's
    tests keep their order. Under pytest-xdist each worker also writes down which files use the
    local cluster, for the scheduler below."""
    files: dict[str, tuple] = {}
    for item in items:
        path = item.nodeid.split("::")[0]
        rank = files.get(path, (2, 0.0))
        if _uses_the_cluster(item) or path.startswith("notebooks/06_"):
            rank = (0, 0.0)
        elif path.endswith(".ipynb"):
            rank = (1, -_stored_run_seconds(Path(str(item.fspath))))
        files[path] = min(rank, files.get(path, rank))
    items.sort(key=lambda item: files[item.nodeid.split("::")[0]])
    if os.environ.get(_CLUSTER_FILES) and os.environ.get("PYTEST_XDIST_WORKER"):
        out = Path(os.environ[_CLUSTER_FILES])
        tmp = out.with_name(f"{out.name}.{os.environ['PYTEST_XDIST_WORKER']}")
        tmp.write_text(json.dumps(sorted(p for p, rank in files.items() if rank[0] == 0)))
        tmp.replace(out)


# --------------------------------------------------------- one worker for the local cluster
# The local cluster runs one two-node job at a time. With one file to a worker (--dist
# loadfile), a job of the second file that uses it queues behind the first file's jobs (the
# printed sbatch lines are all submitted at once) and that worker waits minutes doing nothing.
# So under --dist loadfile every file that uses the cluster (notebook 06 too) is one unit of work:
# one worker submits and waits while the others compute. The scheduler reads which files those
# are from the workers' collection (markers and fixtures are known there, not here).
_CLUSTER_FILES = "WORKSHOP_CLUSTER_FILES_JSON"


def pytest_configure(config):
    if not os.environ.get("PYTEST_XDIST_WORKER") and getattr(config.option, "dist", "no") == "loadfile":
        import tempfile
        os.environ[_CLUSTER_FILES] = os.path.join(tempfile.mkdtemp(prefix="workshop-xdist-"), "cluster-files.json")


def pytest_unconfigure(config):
    if not os.environ.get("PYTEST_XDIST_WORKER") and os.environ.get(_CLUSTER_FILES):
        import shutil
        shutil.rmtree(Path(os.environ.pop(_CLUSTER_FILES)).parent, ignore_errors=True)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if getattr(config.option, "dist", "no") != "loadfile" or not os.environ.get(_CLUSTER_FILES):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ClusterFilesTogether(LoadScopeScheduling):
        """--dist loadfile, except that the files that use the local cluster are one unit."""
        _cluster: frozenset | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._cluster is None:   # called once the workers have collected
                self._cluster = frozenset(json.loads(Path(os.environ[_CLUSTER_FILES]).read_text()))
            path = nodeid.split("::")[0]
            return "the local Slurm cluster" if path in self._cluster else path

    return ClusterFilesTogether(config, log)


# Notebook 06 submits jobs to the local cluster when one runs (and says it skipped otherwise): in
# the suite it gets one, as the Slurm tests do, whichever worker runs it and whenever.
_CLUSTER_HELD = []


def pytest_runtest_setup(item):
    if item.nodeid.startswith("notebooks/06_") and not _CLUSTER_HELD:
        sys.path.insert(0, str(Path(__file__).parent / "tests"))
        import slurm_cluster
        if slurm_cluster.why_not_possible() is None:
            _CLUSTER_HELD.append(slurm_cluster.acquire())


def pytest_sessionfinish(session):
    if _CLUSTER_HELD:
        import slurm_cluster
        slurm_cluster.release(_CLUSTER_HELD.pop())


# --------------------------------------------------------------- where the suite's time went
NOTEBOOK_BUDGET_S = 120  # design.md: every notebook under 2 minutes on 2 CPU cores
_durations: dict[str, float] = {}
_cpu: dict[str, float] = {}
_where: dict[str, tuple[str, float]] = {}
_START = pytest.StashKey[float]()


def _tree_seconds(proc) -> float:
    """CPU seconds of ``proc``, of the children it reaped and of its live descendants."""
    total = 0.0
    try:
        tree = [proc, *proc.children(recursive=True)]
    except psutil.Error:   # it ended meanwhile
        return 0.0
    for p in tree:
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            pass
    return total


def _slurm_daemons():
    return [p for p in psutil.process_iter(["name"]) if p.info["name"] in ("slurmd", "slurmstepd")] \
        if psutil else []


def cpu_seconds(item) -> float:
    if psutil is None:
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system
    total = _tree_seconds(psutil.Process())
    if item.get_closest_marker("slurm") or "cluster" in getattr(item, "fixturenames", ()) \
            or item.nodeid.startswith("notebooks/06_"):
        # the jobs' processes are the daemons' children, not ours
        total += sum(_tree_seconds(p) for p in _slurm_daemons() if p.info["name"] == "slurmd")
    return total


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    item.stash[_START] = cpu_seconds(item)
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    now = cpu_seconds(item)
    # never below 0: a subtree that ends unreaped (a fork server when its kernel stops, a job's
    # slurmstepd) leaves the live tree with all it used; what it used was counted while it ran
    report.user_properties.append(("cpu_s", max(0.0, now - item.stash.get(_START, now))))
    item.stash[_START] = now


def pytest_runtest_logreport(report):
    _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration
    cpu = sum(v for k, v in report.user_properties if k == "cpu_s")
    _cpu[report.nodeid] = _cpu.get(report.nodeid, 0.0) + cpu
    if report.when == "setup":   # when and where it ran: which worker, seconds since the epoch
        node = getattr(report, "node", None)
        _where[report.nodeid] = (getattr(getattr(node, "gateway", None), "id", "main"),
                                 getattr(report, "start", 0.0))


def pytest_terminal_summary(terminalreporter, config):
    """A short table at the end of every run: the ten slowest test files with their CPU time,
    every notebook's time beside the 2 minutes it is meant to take (a report, not a timed test),
    the ten slowest tests."""
    if not _durations or hasattr(config, "workerinput"):
        return
    if os.environ.get("WORKSHOP_TIMES_JSON"):   # every test's (wall, cpu, worker, start), for a closer look
        with open(os.environ["WORKSHOP_TIMES_JSON"], "w") as f:
            json.dump({k: (v, _cpu.get(k, 0.0), *_where.get(k, ("?", 0.0))) for k, v in _durations.items()},
                      f, indent=0)
    wall: dict[str, float] = {}
    cpu: dict[str, float] = {}
    for nodeid, seconds in _durations.items():
        path = nodeid.split("::")[0]
        wall[path] = wall.get(path, 0.0) + seconds
        cpu[path] = cpu.get(path, 0.0) + _cpu.get(nodeid, 0.0)
    tr = terminalreporter
    tr.section("where the time went")
    tr.write_line(f"{sum(wall.values()):8.1f} s of tests in all ({len(_durations)} tests), "
                  f"{sum(cpu.values()):.1f} s of CPU")
    tr.write_line(f"{'wall':>8}   {'cpu':>7}")
    tests = sorted(((p, t) for p, t in wall.items() if not p.endswith(".ipynb")), key=lambda kv: -kv[1])
    for path, seconds in tests[:10]:
        tr.write_line(f"{seconds:8.1f} s {cpu[path]:7.1f} s  {path}")
    workers = getattr(config.option, "numprocesses", None)
    if isinstance(workers, int) and workers > 1:   # the notebooks' wall time here is shared with the other workers' tests
        tr.write_line(f"notebooks (each shared the cores with {workers - 1} other worker(s); alone each takes less, "
                      "the README's table):")
    for path, seconds in sorted((p, t) for p, t in wall.items() if p.endswith(".ipynb")):
        over = "; OVER" if seconds > NOTEBOOK_BUDGET_S else ""
        tr.write_line(f"{seconds:8.1f} s {cpu[path]:7.1f} s  {path}   (stated: under {NOTEBOOK_BUDGET_S} s{over})")
    tr.write_line("slowest tests:")
    for nodeid, seconds in sorted(_durations.items(), key=lambda kv: -kv[1])[:10]:
        tr.write_line(f"{seconds:8.1f} s {_cpu.get(nodeid, 0.0):7.1f} s  {nodeid}")
