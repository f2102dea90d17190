"""The suite's time report (here, at the root, so that the notebooks' cells are counted too:
hooks of tests/conftest.py see only the tests under tests/)."""
from __future__ import annotations

# --------------------------------------------------------------- where the suite's time went
NOTEBOOK_BUDGET_S = 120  # design.md: every notebook under 2 minutes on 2 CPU cores
_durations: dict[str, float] = {}


def pytest_runtest_logreport(report):
    _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    """A short table at the end of every run: the ten slowest test files, every notebook's time
    beside the 2 minutes it is meant to take (a report, not a timed test), the ten slowest tests."""
    if not _durations:
        return
    by_file: dict[str, float] = {}
    for nodeid, seconds in _durations.items():
        path = nodeid.split("::")[0]
        by_file[path] = by_file.get(path, 0.0) + seconds
    tr = terminalreporter
    tr.section("where the time went")
    tr.write_line(f"{sum(by_file.values()):8.1f} s in all, {len(_durations)} tests")
    tests = sorted(((p, t) for p, t in by_file.items() if not p.endswith(".ipynb")), key=lambda kv: -kv[1])
    for path, seconds in tests[:10]:
        tr.write_line(f"{seconds:8.1f} s  {path}")
    for path, seconds in sorted((p, t) for p, t in by_file.items() if p.endswith(".ipynb")):
        over = "; OVER" if seconds > NOTEBOOK_BUDGET_S else ""
        tr.write_line(f"{seconds:8.1f} s  {path}   (stated: under {NOTEBOOK_BUDGET_S} s{over})")
    tr.write_line("slowest tests:")
    for nodeid, seconds in sorted(_durations.items(), key=lambda kv: -kv[1])[:10]:
        tr.write_line(f"{seconds:8.1f} s  {nodeid}")
