"""The participants' set of notebooks: the same sources, the exercises' stored outputs cleared and
the cells that run the reference solutions left out.

    make participant-notebooks                                  # into participant-notebooks/
    python -m source_code.participant_notebooks --out /course/notebooks
    python -m source_code.participant_notebooks --repository --out /course/workshop

An instructor hands this set out (or copies it into the course's shared directory) instead of
notebooks/: every other cell keeps its stored outputs and figures, so a participant can read a
notebook before running it; an exercise cell (the one with the `TODO`) comes without what it
printed, and the collapsed cell that runs the reference solution through the same check is
replaced by a one-line note, as is a later cell that needs what only that cell defined (06 runs
the reference line on the cluster). The check functions stay in source_code/ (they never
import the solutions).
START_HERE.md and the participants' pages it links come along. The folder must not exist yet:
nothing a participant wrote there is ever overwritten.

`--repository` builds what participants clone or copy instead of the instructor's repository:
its files as git lists them, without the reference solutions (source_code/solutions/), the
tests that run them, and the instructor's pages, with the participants' set as its notebooks/.
Nothing a participant runs imports the solutions (the check functions never do; the cells that
run them are the ones left out), so every notebook, `make venv`, `make check` and `make lab`
work there as in the full repository; the instructor hands each solution out after its
exercise (notebooks/INSTRUCTOR_NOTES.md says how).
"""
from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

from source_code.cli import Parser
from source_code.errors import LaunchError, run_main

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
# the participants' pages (START_HERE links them; COURSE_PLAN, COURSE_DAY, INSTRUCTOR_NOTES stay out)
ALSO = ["START_HERE.md", "PRE_COURSE_MESSAGE.md", "LAB_ON_A_CLUSTER.md", "SLOW_QUEUE.md"]
# what the participants' repository leaves out: the reference solutions, the tests that import
# them, and the instructor's pages (its notebooks/ is the participants' set, built by build())
LEFT_OUT = ("source_code/solutions/", "tests/", "conftest.py", ".ci/", "notebooks/")
NOTE = ("*In the instructor's copy, a collapsed cell here runs the reference solution (or what "
        "needs it) through the same check.*")


def is_exercise(cell: dict) -> bool:
    return cell["cell_type"] == "code" and "TODO" in "".join(cell["source"])


def is_reference(cell: dict) -> bool:
    """The collapsed cell that runs a reference solution (tests/test_notebook_anatomy.py keeps
    every such cell collapsed)."""
    return (cell["cell_type"] == "code" and "source_code.solutions" in "".join(cell["source"])
            and bool(cell["metadata"].get("jupyter", {}).get("source_hidden")))


def names(cell: dict) -> tuple[set[str], set[str]]:
    """(names the cell defines, names it reads) of a code cell, by its syntax tree."""
    src = "\n".join(ln for ln in "".join(cell["source"]).splitlines() if not ln.lstrip().startswith(("%", "!")))
    defined, read = set(), set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            defined |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            defined.add(node.name)
        elif isinstance(node, ast.arg):
            defined.add(node.arg)
        elif isinstance(node, ast.Name):
            (defined if isinstance(node.ctx, ast.Store) else read).add(node.id)
    return defined, read


def participant_copy(nb: dict) -> tuple[dict, int, int]:
    """(the notebook for participants, exercise cells cleared, cells replaced by the note)."""
    cells, cleared, replaced, missing = [], 0, 0, set()
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            defined, read = names(cell)
            if is_reference(cell) or (read - defined) & missing:
                missing |= defined
                cells.append({"cell_type": "markdown", "id": cell.get("id", f"note{replaced}"),
                              "metadata": {}, "source": [NOTE]})
                replaced += 1
                continue
            missing -= defined
        if is_exercise(cell):
            cell = {**cell, "outputs": [], "execution_count": None,
                    "metadata": {k: v for k, v in cell["metadata"].items() if k != "execution"}}
            cleared += 1
        cells.append(cell)
    return {**nb, "cells": cells}, cleared, replaced


def build(out: Path, sources: Path = NOTEBOOKS, links_from: Path | None = None) -> list[str]:
    """Write the set into ``out`` (which must not exist); one line per notebook. Links of the
    pages that leave the folder are rewritten as seen from ``links_from`` (default: ``sources``)."""
    if out.exists():
        raise LaunchError(f"error: {out} exists; choose another --out or move it away first "
                          f"(nothing a participant wrote is overwritten)")
    paths = sorted(sources.glob("[0-9][0-9]_*.ipynb"))
    if not paths:
        raise LaunchError(f"error: no numbered notebooks in {sources}")
    out.mkdir(parents=True)
    lines = []
    for path in paths:
        nb, cleared, dropped = participant_copy(json.loads(path.read_text()))
        (out / path.name).write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
        lines.append(f"{path.name}: {cleared} exercise cell(s) cleared, {dropped} cell(s) left to the instructor's copy")
    for name in ALSO:
        if (sources / name).exists():
            (out / name).write_text(relink((sources / name).read_text(), links_from or sources, out))
    return lines


def repository_files(root: Path = ROOT) -> list[str]:
    """The repository's files, as git lists them: tracked, and new ones it does not ignore."""
    try:
        res = subprocess.run(["git", "-C", str(root), "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
                             capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        raise LaunchError(f"error: {root} is not a git clone; build the participants' repository from "
                          f"the instructor's clone") from None
    return sorted({f for f in res.stdout.split("\0") if f and (root / f).is_file()})


def build_repository(out: Path, root: Path = ROOT) -> list[str]:
    """The participants' repository in ``out`` (which must not exist): every file but LEFT_OUT,
    the participants' set as its notebooks/."""
    if out.exists():
        raise LaunchError(f"error: {out} exists; choose another --out or move it away first "
                          f"(nothing a participant wrote is overwritten)")
    files = [f for f in repository_files(root) if not f.startswith(LEFT_OUT)]
    for f in files:
        (out / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / f, out / f)
    lines = build(out / "notebooks", root / "notebooks", links_from=out / "notebooks")
    return lines + [f"{len(files)} files of the repository copied; left out: {', '.join(LEFT_OUT[:-1])}"]


def relink(markdown: str, source_dir: Path, out: Path) -> str:
    """Links that leave the notebooks' folder (`../README.md`) rewritten to reach the same file
    from ``out``, wherever the set is put (a course's shared folder, a home directory)."""
    def fix(m):
        target = (source_dir / m.group(1)).resolve()
        return f"]({os.path.relpath(target, out.resolve())}{m.group(2) or ''})"
    return re.sub(r"\]\((\.\./[^)#\s]+)(#[^)\s]*)?\)", fix, markdown)


def main(argv=None) -> None:
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "participant-notebooks",
                   help="a folder that does not exist yet (default: participant-notebooks/)")
    p.add_argument("--repository", action="store_true",
                   help="the whole repository for participants, without the solutions and tests")
    args = p.parse_args(argv)
    lines = (build_repository if args.repository else build)(args.out)
    notebooks = sum(ln.endswith("left to the instructor's copy") for ln in lines)
    print("\n".join(lines))
    print(f"participants' {'repository' if args.repository else 'set'}: {args.out} ({notebooks} notebooks)")


if __name__ == "__main__":
    run_main(main)
