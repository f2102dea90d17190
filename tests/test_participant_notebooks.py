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
    # START_HERE's links that leave the folder reach the same files from wherever the set is
    start = (out / "START_HERE.md").read_text()
    links = re.findall(r"\]\(([^)#\s]+)", start)
    assert links and all((out / link).resolve().exists() for link in links if "://" not in link), links
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
    assert any("06_launching.ipynb: 2 exercise cell(s) cleared, 4 cell(s)" in ln for ln in lines), lines


def test_a_notebook_of_the_set_runs_top_to_bottom(built):
    out, _ = built
    nb = nbformat.read(out / "04_dataparallel.ipynb", as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(out)}}).execute()
    printed = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "exercise not done yet" in printed   # the learner's TODO, as a participant meets it


def test_notebooks_find_the_repository_from_the_package_not_from_their_folder(built):
    """The set may live anywhere (a course's shared folder): a notebook that needs the
    repository's files (the job scripts) finds them from where source_code is installed."""
    out, _ = built
    uses = [(p.name, i) for p in sorted(pn.NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
            for i, c in enumerate(json.loads(p.read_text())["cells"])
            if c["cell_type"] == "code" and re.search(r"Path\(\s*['\"]\.\.['\"]\s*\)", "".join(c["source"]))]
    assert not uses, f"cells that take the repository to be the notebooks' parent folder: {uses}"
    setup = nbformat.read(out / "06_launching.ipynb", as_version=4).cells[1]
    assert "ROOT =" in setup.source
    nb = nbformat.v4.new_notebook(cells=[setup, nbformat.v4.new_code_cell(
        "assert (ROOT / 'slurm' / 'common.sh').is_file() and Path.cwd() != ROOT / 'notebooks', ROOT")])
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(out)}}).execute()


def test_an_existing_folder_is_never_written_into(built):
    out, _ = built
    with pytest.raises(LaunchError, match="exists; choose another --out"):
        pn.build(out)
