"""The suite's time report (here, at the root, so that the notebooks' cells are counted too:
hooks of tests/conftest.py see only the tests under tests/).

Beside each file's wall time it gives the CPU time spent while the file ran: the busy seconds of
all cores, read from /proc/stat, so the file's own processes count (torchrun's workers, the
notebook's kernel and what it starts, the Slurm jobs it submits). On a quiet machine a file
whose CPU time is far below 2 x its wall time (2 cores) spends that time waiting, not working.
"""
from __future__ import annotations

import json
import os

import pytest

# --------------------------------------------------------------- where the suite's time went
NOTEBOOK_BUDGET_S = 120  # design.md: every notebook under 2 minutes on 2 CPU cores
_durations: dict[str, float] = {}
_cpu: dict[str, float] = {}
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def busy_cpu_seconds() -> float:
    """Seconds all cores together spent busy since boot (0.0 where /proc/stat is missing)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0.0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)   # idle + iowait
    return (sum(fields[:8]) - idle) / _TICK


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    start = busy_cpu_seconds()
    yield
    _cpu[item.nodeid] = _cpu.get(item.nodeid, 0.0) + busy_cpu_seconds() - start


def pytest_runtest_logreport(report):
    _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    """A short table at the end of every run: the ten slowest test files with their CPU time,
    every notebook's time beside the 2 minutes it is meant to take (a report, not a timed test),
    the ten slowest tests."""
    if not _durations:
        return
    if os.environ.get("WORKSHOP_TIMES_JSON"):   # every test's (wall, cpu), for a closer look
        with open(os.environ["WORKSHOP_TIMES_JSON"], "w") as f:
            json.dump({k: (v, _cpu.get(k, 0.0)) for k, v in _durations.items()}, f, indent=0)
    wall: dict[str, float] = {}
    cpu: dict[str, float] = {}
    for nodeid, seconds in _durations.items():
        path = nodeid.split("::")[0]
        wall[path] = wall.get(path, 0.0) + seconds
        cpu[path] = cpu.get(path, 0.0) + _cpu.get(nodeid, 0.0)
    tr = terminalreporter
    tr.section("where the time went")
    tr.write_line(f"{sum(wall.values()):8.1f} s in all, {len(_durations)} tests; "
                  f"cpu: busy seconds of all {os.cpu_count()} cores while the file ran")
    tr.write_line(f"{'wall':>8}   {'cpu':>7}")
    tests = sorted(((p, t) for p, t in wall.items() if not p.endswith(".ipynb")), key=lambda kv: -kv[1])
    for path, seconds in tests[:10]:
        tr.write_line(f"{seconds:8.1f} s {cpu[path]:7.1f} s  {path}")
    for path, seconds in sorted((p, t) for p, t in wall.items() if p.endswith(".ipynb")):
        over = "; OVER" if seconds > NOTEBOOK_BUDGET_S else ""
        tr.write_line(f"{seconds:8.1f} s {cpu[path]:7.1f} s  {path}   (stated: under {NOTEBOOK_BUDGET_S} s{over})")
    tr.write_line("slowest tests:")
    for nodeid, seconds in sorted(_durations.items(), key=lambda kv: -kv[1])[:10]:
        tr.write_line(f"{seconds:8.1f} s {_cpu.get(nodeid, 0.0):7.1f} s  {nodeid}")
