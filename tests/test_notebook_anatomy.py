"""Every notebook follows the anatomy of ../shared/design.md, read from the files (no kernel).

What a learner meets first (outcomes, times, an exercise, take-aways) and what self-study needs:
a reference solution never shown right under its exercise (its cell is collapsed, source and
output, so a learner tries first; the cell still runs under nbval and in the tests)."""
import json
import re
from datetime import datetime
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def cells(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cells"]


def text(cell: dict) -> str:
    return "".join(cell["source"])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_outcomes_time_exercise_and_take_aways(path):
    body = "\n".join(text(c) for c in cells(path))
    assert "After this notebook you can" in body
    assert "instructor-led" in body
    assert "TODO" in body and "take-aways" in body.lower()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_reference_solutions_are_collapsed(path):
    shown = [i for i, c in enumerate(cells(path)) if c["cell_type"] == "code"
             and "from source_code.solutions" in text(c)
             and not (c["metadata"].get("jupyter", {}).get("source_hidden")
                      and c["metadata"].get("jupyter", {}).get("outputs_hidden"))]
    assert not shown, f"cells {shown} show a reference solution: collapse source and output"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_reference_solutions_print_nothing(path):
    """Restart-and-Run-All in JupyterLab shows a collapsed cell's new output: a reference cell
    that prints (its source, its answer, the check's verdict) puts the answer on screen right
    under the exercise. It only asserts; the stored run shows what it prints: nothing."""
    loud = [i for i, c in enumerate(cells(path)) if c["cell_type"] == "code"
            and "from source_code.solutions" in text(c) and c.get("outputs")]
    assert not loud, f"{path.name}: reference-solution cells {loud} print; assert instead"


TIME_COMMENT = re.compile(r"# about (\d+(?:\.\d+)?) s on 2 CPU cores\b")
NEEDS_COMMENT_S = 15  # a cell past this at the README's pace says how long it takes
STALE_FACTOR = 4      # a stated N this far off the stored run, at the same pace, is out of date


def stored_seconds(cell: dict) -> float | None:
    """How long the stored run of a code cell took (nbconvert's execution timings), or None."""
    ex = cell["metadata"].get("execution", {})
    if "iopub.execute_input" not in ex or "shell.execute_reply" not in ex:
        return None
    start, end = (datetime.fromisoformat(ex[k].replace("Z", "+00:00"))
                  for k in ("iopub.execute_input", "shell.execute_reply"))
    return (end - start).total_seconds()


def readme_seconds() -> dict[str, float]:
    """The README's table of notebook times on quiet cores: {"00": seconds, ...}."""
    lines = (NOTEBOOKS[0].parents[1] / "README.md").read_text().splitlines()
    head = next((ln for ln in lines if ln.startswith("| notebook | 00 ")), None)
    row = next((ln for ln in lines if ln.startswith("| seconds |")), None)
    if head is None or row is None:
        return {}
    cells = lambda ln: [c.strip().rstrip("*") for c in ln.split("|")[2:-1]]  # noqa: E731
    return {n: float(v) for n, v in zip(cells(head), cells(row)) if v.replace(".", "").isdigit()}


def time_problems(path: Path, quiet_total: float | None = None) -> list[str]:
    """A long cell says first how long it takes (`# about N s on 2 CPU cores`, N a whole number),
    and a stated N is not far from the stored run. The stored run may come from a machine
    several times faster or slower than the quiet cores the N were measured on (a busy one made
    cells 5x slower here): so every stored time is first brought to the pace of the README's
    quiet run of the notebook (``quiet_total``), by the ratio of the stored cells' sum to it.
    A comment is then required past NEEDS_COMMENT_S, and stale when STALE_FACTOR x off: neither
    flips when the notebooks are stored again elsewhere, and one stale comment stands out."""
    code = [(i, c) for i, c in enumerate(cells(path)) if c["cell_type"] == "code"]
    stored = {i: stored_seconds(c) for i, c in code}
    total = sum(t for t in stored.values() if t)
    pace = total / quiet_total if quiet_total and total else 1.0  # stored seconds per quiet second
    problems = []
    for i, c in code:
        if stored[i] is None:
            continue
        seconds = stored[i] / pace                               # at the quiet run's pace
        first = text(c).split("\n", 1)[0]
        stated = TIME_COMMENT.match(first)
        if stated is None and seconds > NEEDS_COMMENT_S:
            problems.append(f"{path.name} cell {i} took {seconds:.0f} s in the stored run (at the README's "
                            f"pace): make its first line `# about N s on 2 CPU cores`, N measured on quiet cores")
        elif stated and not stated[1].isdigit():
            problems.append(f"{path.name} cell {i} says about {stated[1]} s: a whole number of seconds")
        elif stated and not seconds / STALE_FACTOR <= float(stated[1]) <= seconds * STALE_FACTOR:
            problems.append(f"{path.name} cell {i} says about {stated[1]} s but took {seconds:.0f} s in the "
                            f"stored run (at the README's pace): measure it again on quiet cores and state "
                            f"that (or make the cell fast again)")
    return problems


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_long_cells_say_how_long_they_take(path):
    problems = time_problems(path, readme_seconds().get(path.name[:2]))
    assert not problems, "\n".join(problems)


def test_time_check_catches_a_missing_or_wrong_estimate(tmp_path):
    def cell(source, seconds):
        return {"cell_type": "code", "source": source, "metadata": {"execution": {
            "iopub.execute_input": "2026-01-01T00:00:00.000000Z",
            "shell.execute_reply": f"2026-01-01T00:{seconds // 60:02d}:{seconds % 60:02d}.000000Z"}}}
    nb = tmp_path / "99_x.ipynb"
    for source, seconds, bad in [("run()", 20, True), ("# about 12 s on 2 CPU cores\nrun()", 12, False),
                                 ("# about 12.5 s on 2 CPU cores\nrun()", 12, True),
                                 ("# about 60 s on 2 CPU cores\nrun()", 12, True),
                                 ("# about 3 s on 2 CPU cores\nrun()", 20, True),
                                 ("run()\n# about 20 s on 2 CPU cores", 20, True),
                                 ("# about 20 s on 2 CPU cores\nrun()", 3, True), ("run()", 12, False)]:
        nb.write_text(json.dumps({"cells": [cell(source, seconds)]}))
        assert bool(time_problems(nb)) == bad, (source, seconds)
    # stored on a machine 5x slower than the README's quiet run (60 s in all): right comments stay
    # right, a cell of 2 s quiet needs none, and one stale comment still stands out
    cells_ = [cell("# about 30 s on 2 CPU cores\nrun()", 150), cell("# about 20 s on 2 CPU cores\nrun()", 100),
              cell("run()", 10), cell("setup()", 40)]
    nb.write_text(json.dumps({"cells": cells_}))
    assert time_problems(nb, quiet_total=60) == []
    cells_[1] = cell("# about 2 s on 2 CPU cores\nrun()", 100)
    nb.write_text(json.dumps({"cells": cells_}))
    assert [p.split(" says")[0] for p in time_problems(nb, quiet_total=60)] == ["99_x.ipynb cell 1"]


def _kernel_display_name() -> str:
    """What JupyterLab writes into a notebook's kernelspec when its kernel (this venv's) starts."""
    from jupyter_client.kernelspec import KernelSpecManager
    return KernelSpecManager().get_kernel_spec("python3").display_name


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_opening_the_notebook_in_the_lab_changes_nothing(path):
    """A stored kernelspec that differs from the kernel's marks the notebook modified as soon as
    the lab opens it, and autosave then rewrites the tracked file (test_jupyterlab.py sees it in
    a browser for one notebook; this checks all of them from the files)."""
    spec = json.loads(path.read_text())["metadata"]["kernelspec"]
    assert (spec["name"], spec["display_name"]) == ("python3", _kernel_display_name()), spec


def test_the_start_page_links_every_notebook_in_order_under_its_title():
    start = (NOTEBOOKS[0].parent / "START_HERE.md").read_text()
    linked = re.findall(r"^\d+\. \[(.+)\]\((\d\d_\w+\.ipynb)\)$", start, re.M)
    titles = [text(cells(p)[0]).splitlines()[0].lstrip("# ").strip() for p in NOTEBOOKS]
    assert linked == list(zip(titles, [p.name for p in NOTEBOOKS])), linked
