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
        assert times == sorted(times) and times[-1] <= course_plan.DAY_END, rows
        assert taught == sum(int(m) for m in re.findall(r"\| (\d+) min \|$", "\n".join(rows[:-2]), re.M))
        assert sum("*lunch*" in r for r in rows) == (1 if times[-1] > 13 * 60 else 0), rows
        lunch = next((i for i, r in enumerate(rows) if "*lunch*" in r), None)
        if lunch is not None:   # an hour at least before the afternoon starts
            assert times[lunch + 1] - times[lunch] >= 60, rows


def test_a_day_over_its_length_is_refused():
    nbs = course_plan.notebooks()
    with pytest.raises(LaunchError, match="after 17:00; mark a section optional or move a notebook"):
        course_plan.day_agenda(sorted(nbs), nbs)
    short = {n: dict(nb, minutes=5) for n, nb in nbs.items()}
    rows, taught = course_plan.day_agenda(sorted(short), short)    # the same day at 5 minutes each fits
    assert taught == 5 * len(short) and rows[-1].startswith("| ") and "*end*" in rows[-1]


@pytest.mark.parametrize("course, day", [(c, i) for c, days in course_plan.COURSES.items() for i in range(len(days))])
def test_every_day_ends_by_its_end(course, day):
    """Each agenda's day, built from the core sections' computed minutes, ends by DAY_END (the
    notebooks not yet marked count every section as core: their day can only get shorter)."""
    nbs = course_plan.notebooks()
    numbers = course_plan.COURSES[course][day]
    rows, taught = course_plan.day_agenda(numbers, nbs)
    end = re.search(r"^\| (\d\d):(\d\d) \| \*end\*", rows[-1])
    assert end and int(end[1]) * 60 + int(end[2]) <= course_plan.DAY_END, rows
    assert taught == sum(nbs[n]["minutes"] for n in numbers)


def _timed(tmp_path, monkeypatch):
    """A notebook of two sections: 'Core' (250 words, an exercise, a cell of 30 s stored) and
    'Extra' (marked optional, 400 words), a summary cell that repeats the prose (not counted)."""
    def md(text, **meta):
        return {"cell_type": "markdown", "metadata": meta, "source": text}

    def code(text, seconds):
        return {"cell_type": "code", "metadata": {"execution": {
            "iopub.execute_input": "2026-01-01T00:00:00.000000Z",
            "shell.execute_reply": f"2026-01-01T00:00:{seconds:02d}.000000Z"}}, "source": text,
            "outputs": [], "execution_count": 1}
    cells = [md("# 98 · Timed\n\nabout 5 minutes instructor-led"),
             md("## 1. Core", workshop={"section": "core"}), md("word " * 250),
             code("x = ...  # TODO", 30),
             md("## 2. Extra", workshop={"section": "optional"}),
             md("- a summary " * 20, workshop={"summary": True}), md("word " * 400)]
    (tmp_path / "98_timed.ipynb").write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4,
                                                         "nbformat_minor": 5}))
    monkeypatch.setattr(course_plan, "NOTEBOOKS", tmp_path)
    monkeypatch.setattr(course_plan, "WORDS_PER_MINUTE", 100)
    monkeypatch.setattr(course_plan, "EXERCISE_MINUTES", 15)
    return course_plan.notebooks()["98"]


def test_sections_are_timed_from_words_run_times_and_exercise_slots(tmp_path, monkeypatch):
    nb = _timed(tmp_path, monkeypatch)
    got = [(s["title"], s["kind"], s["words"], s["exercises"], round(s["minutes"], 2)) for s in nb["sections"]]
    # 8 title words; 250 words at 100 a minute + 30 s + one 15-minute slot; 400 words at 100 a minute
    assert got == [("title and setup", "core", 8, 0, 0.08), ("1. Core", "core", 250, 1, 18.0),
                   ("2. Extra", "optional", 400, 0, 4.0)], got
    assert (nb["minutes"], nb["optional"]) == (20, 5)   # rounded up to 5 minutes
    assert course_plan.skipped(["98"], {"98": nb}) == ["98 · 2. Extra (4 min)"]


# notebooks whose sections are marked and slides fitted (python -m source_code.slides.fit); the
# others are being edited and get their marks afterwards (the same command): empty PENDING then
PENDING: set[str] = set()
DONE = [p for p in sorted(course_plan.NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")) if p.name[:2] not in PENDING]


@pytest.mark.parametrize("path", DONE, ids=lambda p: p.name[:2])
def test_every_section_is_marked_and_the_notebook_states_its_computed_time(path):
    cells = json.loads(path.read_text())["cells"]
    heads = [c for c in cells if c["cell_type"] == "markdown" and re.match(r"## ", "".join(c["source"]))]
    unmarked = ["".join(c["source"]).splitlines()[0] for c in heads
                if course_plan.mark(c).get("section") not in (course_plan.CORE, course_plan.OPTIONAL)]
    assert heads and not unmarked, f"{path.name}: sections without a core/optional mark: {unmarked}"
    assert all(len(re.findall(r"^## ", "".join(c["source"]), re.M)) == 1 for c in heads), "a cell holds two sections"
    nb = course_plan.notebooks()[path.name[:2]]
    stated = re.search(r"about (\d+) minutes instructor-led \(its core sections",
                       "\n".join("".join(c["source"]) for c in cells[:8]))
    assert stated, f"{path.name}: no computed time line; python -m source_code.slides.fit {path}"
    # the README's run times move a notebook's minutes a little; a stated time 5 minutes off is stale
    assert abs(int(stated[1]) - nb["minutes"]) <= 5, (
        f"{path.name} states {stated[1]} minutes, its core sections take {nb['minutes']}: "
        f"python -m source_code.slides.fit {path.relative_to(course_plan.NOTEBOOKS.parent)}")


@pytest.mark.parametrize("path", DONE, ids=lambda p: p.name[:2])
def test_self_study_takes_at_least_the_instructor_led_time(path):
    """The course plan leaves notebooks to self-study "more on one's own": a notebook's own time
    line never gives less for self-study than its core and optional sections instructor-led."""
    text = "\n".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"][:8])
    led = re.search(r"about (\d+) minutes instructor-led \(its core sections, exercises included"
                    r"(?:; (\d+) more with the optional ones)?\)", text)
    alone = re.search(r"(?:self-study (\d+)(?: to \d+)? minutes|(\d+) min(?:utes)?\s+(?:self-study|on your own))",
                      text[led.end():] if led else "")
    assert led and alone, f"{path.name}: no time line with instructor-led and self-study minutes"
    total, own = int(led[1]) + int(led[2] or 0), int(alone[1] or alone[2])
    assert own >= total, f"{path.name}: {own} minutes on one's own, {total} instructor-led"


def test_the_plan_lists_what_each_day_skips():
    text = course_plan.PAGE.read_text()
    nbs = course_plan.notebooks()
    optional = [(n, s["title"]) for n, nb in nbs.items() for s in nb["sections"] if s["kind"] == course_plan.OPTIONAL]
    assert optional, "no notebook marks an optional section"
    presented = {n for n in nbs if f"[{n} · " in text}   # on some day's table (the others: self-study)
    assert len(presented) >= len(nbs) - 2, sorted(set(nbs) - presented)
    for n, title in optional:
        if n in presented:
            assert f"{n} · {title} (" in text, (n, title)


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
