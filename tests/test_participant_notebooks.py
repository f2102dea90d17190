"""The participants' set (source_code/participant_notebooks.py): built from notebooks/ as they are,
the exercises' stored outputs cleared, no reference solution left, every other cell as stored,
and a notebook of the set runs from top to bottom."""
import json
import re

import nbformat
import pytest
from nbclient import NotebookClient

from source_code import participant_notebooks as pn
from source_code.errors import LaunchError


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("course") / "notebooks"
    lines = pn.build(out)
    return out, lines


def test_every_notebook_is_there_without_its_solutions_and_exercise_outputs(built):
    out, lines = built
    sources = sorted(pn.NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    assert [p.name for p in sorted(out.glob("*.ipynb"))] == [p.name for p in sources]
    # the pages' links (START_HERE's that leave the folder included) reach files from wherever the set is
    assert sorted(p.name for p in out.glob("*.md")) == sorted(pn.ALSO)
    for page in out.glob("*.md"):
        links = [ln for ln in re.findall(r"\]\(([^)#\s]+)", page.read_text()) if "://" not in ln]
        assert all((out / link).resolve().exists() for link in links), (page.name, links)
    replaced_total = 0
    for src in sources:
        original = nbformat.read(src, as_version=4)
        copy = nbformat.read(out / src.name, as_version=4)
        nbformat.validate(copy)
        text = "\n".join("".join(c["source"]) for c in copy.cells if c.cell_type == "code")
        assert "source_code.solutions" not in text, src.name
        kept = iter(copy.cells)
        for cell in original.cells:
            mine = next(kept)
            if mine.cell_type == "markdown" and "".join(mine.source) == pn.NOTE:
                assert cell.cell_type == "code", src.name
                replaced_total += 1
            elif pn.is_exercise(cell):
                assert mine.outputs == [] and mine.source == cell.source, src.name
            else:   # as stored, outputs included
                assert mine == cell, f"{src.name}: a cell changed"
        assert next(kept, None) is None
    hidden = sum(pn.is_reference(c) for p in sources for c in json.loads(p.read_text())["cells"])
    # every collapsed reference cell, and notebook 06's run of the reference line on the cluster
    assert replaced_total == hidden + 1 and hidden >= 17, (replaced_total, hidden)
    assert any("06_launching.ipynb: 3 exercise cell(s) cleared, 4 cell(s)" in ln for ln in lines), lines


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    out = tmp_path_factory.mktemp("course") / "workshop"
    return out, pn.build_repository(out)


def test_the_participants_repository_has_no_solutions_and_nothing_imports_them(repository):
    out, lines = repository
    assert not (out / "source_code" / "solutions").exists() and not (out / "tests").exists()
    assert not (out / "notebooks" / "INSTRUCTOR_NOTES.md").exists()
    assert (out / "Makefile").is_file() and (out / "source_code" / "readiness.py").is_file()
    assert sorted(p.name for p in (out / "notebooks").glob("*.md")) == sorted(pn.ALSO)
    start = (out / "notebooks" / "START_HERE.md").read_text()
    assert "](../README.md)" in start and (out / "README.md").is_file()   # its own README, not the instructor's
    # no module, script or notebook left in it imports or runs the solutions
    uses = []
    for path in out.rglob("*"):
        if path.suffix in {".py", ".ipynb", ".sh", ".slurm"} or path.name == "Makefile":
            body = path.read_text()
            if path.suffix == ".ipynb":
                body = "\n".join("".join(c["source"]) for c in json.loads(body)["cells"] if c["cell_type"] == "code")
            if re.search(r"(?:import|from|-m)\s+source_code\.solutions|from source_code import solutions"
                         r"|from \.+ import solutions|import_module\(\s*['\"]source_code\.solutions", body):
                uses.append(str(path.relative_to(out)))
    assert not uses, uses
    assert lines[-1].startswith(f"{len(pn.repository_files()) - sum(f.startswith(pn.LEFT_OUT) for f in pn.repository_files())} files")


def test_a_notebook_of_the_participants_repository_runs_top_to_bottom(repository, monkeypatch):
    """Run from the participants' repository alone: its source_code first on the path, and the
    instructor's clone's editable install (this environment's, which would find the solutions
    beside it) removed from the kernel's import system, as in a participant's own venv."""
    out, _ = repository
    nb = nbformat.read(out / "notebooks" / "04_dataparallel.ipynb", as_version=4)
    alone = nbformat.v4.new_code_cell(
        "import sys\n"
        "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]\n"
        "sys.path_hooks[:] = [h for h in sys.path_hooks if 'editable' not in repr(h).lower()]")
    where = nbformat.v4.new_code_cell(
        "import importlib.util, source_code\n"
        "print('package:', source_code.__file__)\n"
        "print('solutions:', importlib.util.find_spec('source_code.solutions'))")
    nb.cells = [alone] + nb.cells + [where]
    monkeypatch.setenv("PYTHONPATH", str(out))
    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(out / "notebooks")}}).execute()
    printed = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "exercise not done yet" in printed   # the learner's TODO, as a participant meets it
    assert f"package: {out / 'source_code' / '__init__.py'}" in printed and "solutions: None" in printed, printed[-600:]


def test_notebooks_find_the_repository_from_the_package_not_from_their_folder(built):
    """The set may live anywhere (a course's shared folder): a notebook that needs the
    repository's files (the job scripts) finds them from where source_code is installed."""
    out, _ = built
    uses = [(p.name, i) for p in sorted(pn.NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
            for i, c in enumerate(json.loads(p.read_text())["cells"])
            if c["cell_type"] == "code" and re.search(r"Path\(\s*['\"]\.\.['\"]\s*\)", "".join(c["source"]))]
    assert not uses, f"cells that take the repository to be the notebooks' parent folder: {uses}"
    setup = next(c for c in nbformat.read(out / "06_launching.ipynb", as_version=4).cells
                 if c.cell_type == "code")                  # the notebook's first code cell
    assert "ROOT =" in setup.source
    nb = nbformat.v4.new_notebook(cells=[setup, nbformat.v4.new_code_cell(
        "assert (ROOT / 'slurm' / 'common.sh').is_file() and Path.cwd() != ROOT / 'notebooks', ROOT")])
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(out)}}).execute()


def test_an_existing_folder_is_never_written_into(built):
    out, _ = built
    with pytest.raises(LaunchError, match="exists; choose another --out"):
        pn.build(out)


def test_the_repository_needs_a_git_clone_and_a_new_folder(repository, tmp_path):
    out, _ = repository
    with pytest.raises(LaunchError, match="exists; choose another --out"):
        pn.build_repository(out)
    with pytest.raises(LaunchError, match="is not a git clone"):
        pn.repository_files(tmp_path)
