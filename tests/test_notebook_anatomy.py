"""Every notebook follows the anatomy of ../shared/design.md, read from the files (no kernel).

What a learner meets first (outcomes, times, an exercise, take-aways) and what self-study needs:
a reference solution never shown right under its exercise (its cell is collapsed, source and
output, so a learner tries first; the cell still runs under nbval and in the tests)."""
import json
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
