"""The course plan (notebooks/COURSE_PLAN.md) is what source_code/course_plan.py builds from the
notebooks as they are, and every agenda it builds is a day a course can keep."""
import json
import re

import pytest

from source_code import course_plan
from source_code.errors import LaunchError


def test_the_page_is_built_from_the_notebooks_as_they_are():
    assert course_plan.PAGE.read_text() == course_plan.page(), \
        "notebooks/COURSE_PLAN.md is stale: python -m source_code.course_plan --write"


@pytest.mark.parametrize("course", list(course_plan.COURSES))
def test_every_notebook_is_presented_once_or_left_for_self_study(course):
    nbs = course_plan.notebooks()
    days = course_plan.COURSES[course]
    presented = [n for day in days for n in day]
    assert len(presented) == len(set(presented)) and set(presented) <= set(nbs)
    for day in days:
        assert day == sorted(day), f"{course}: a day goes in teaching order"
        rows, taught = course_plan.day_agenda(day, nbs)
        times = [int(h) * 60 + int(m) for h, m in re.findall(r"^\| (\d\d):(\d\d) \|", "\n".join(rows), re.M)]
        assert times == sorted(times) and times[-1] <= course_plan.DAY_END + course_plan.OVERRUN, rows
        assert taught == sum(int(m) for m in re.findall(r"\| (\d+) min \|$", "\n".join(rows[:-2]), re.M))
        assert sum("*lunch*" in r for r in rows) == (1 if times[-1] > 13 * 60 else 0), rows
        lunch = next((i for i, r in enumerate(rows) if "*lunch*" in r), None)
        if lunch is not None:   # an hour at least before the afternoon starts
            assert times[lunch + 1] - times[lunch] >= 60, rows


def test_a_day_too_long_and_a_notebook_without_its_time_are_refused(tmp_path, monkeypatch):
    nbs = course_plan.notebooks()
    with pytest.raises(LaunchError, match="move a notebook to another day"):
        course_plan.day_agenda(sorted(nbs), nbs)
    nb = {"cells": [{"cell_type": "markdown", "source": ["# 00 · A notebook\n", "No time said."]}],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (tmp_path / "00_a.ipynb").write_text(json.dumps(nb))
    monkeypatch.setattr(course_plan, "NOTEBOOKS", tmp_path)
    with pytest.raises(LaunchError, match="00_a.ipynb states no instructor-led time"):
        course_plan.notebooks()


def test_the_sbatch_pattern_is_the_one_the_sbatch_lines_test_submits():
    """The column "prints sbatch lines" and tests/test_sbatch_lines.py read the lines with the
    same function (checked in its source: importing it would collect the cluster's lines)."""
    import ast
    tree = ast.parse((course_plan.NOTEBOOKS.parent / "tests" / "test_sbatch_lines.py").read_text())
    imported = {(node.module, a.name) for node in tree.body if isinstance(node, ast.ImportFrom) for a in node.names}
    assert ("source_code.course_plan", "sbatch_lines") in imported, sorted(imported)
    assert not any(isinstance(node, ast.Assign) and "re.compile" in ast.unparse(node.value) and "sbatch"
                   in ast.unparse(node.value) for node in tree.body), "a second sbatch pattern"


def _notebook(tmp_path, name, text):
    nb = {"cells": [{"cell_type": "markdown", "metadata": {},
                     "source": [f"# {name[:2]} · A notebook\n", "Time: about 20 minutes instructor-led.\n"]},
                    {"cell_type": "markdown", "metadata": {}, "source": [text]}],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (tmp_path / name).write_text(json.dumps(nb))


def test_every_spelling_of_a_printed_sbatch_line_counts_and_prose_does_not(tmp_path, monkeypatch):
    spellings = {
        "00_wrap.ipynb": 'On the cluster: `sbatch --gres=gpu:1 --wrap "python -m source_code.memory.report"`.',
        "01_vars.ipynb": "`FRAMEWORK=deepspeed LAUNCHER=srun sbatch --nodes 2 slurm/frameworks.slurm`",
        "02_split.ipynb": "```bash\nsbatch --nodes 2 \\\n    slurm/ddp_multi_node.slurm --epochs 3\n```",
        "03_prose.ipynb": "Slurm's `sbatch` queues a job script; `squeue --me` shows it.",
        "04_path.ipynb": "The script is in slurm/ddp_single_node.slurm (read it first).",
    }
    for name, text in spellings.items():
        _notebook(tmp_path, name, text)
    monkeypatch.setattr(course_plan, "NOTEBOOKS", tmp_path)
    jobs = {n: nb["jobs"] for n, nb in course_plan.notebooks().items()}
    assert jobs == {"00": True, "01": True, "02": True, "03": False, "04": False}, jobs
    assert course_plan.sbatch_lines(spellings["02_split.ipynb"]) == \
        ["sbatch --nodes 2 slurm/ddp_multi_node.slurm --epochs 3"]
    assert course_plan.sbatch_lines(spellings["00_wrap.ipynb"]) == \
        ['sbatch --gres=gpu:1 --wrap "python -m source_code.memory.report"']
