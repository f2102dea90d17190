"""notebooks/INSTRUCTOR_NOTES.md stays true to the notebooks and the checks it describes.

    python -m pytest tests/test_instructor_notes.py -q

Reads files only (nothing is executed): every numbered notebook has its section, titled exactly
as the notebook's first heading, in the notebooks' order, followed by "The day before and the
morning of"; each section links the source file of every check its notebook calls; every
message quoted after "the check says" occurs verbatim in a string of one of the check files the
section links (`…` stands for a value the check fills in); every relative link resolves; and no
line of the page starts with `sbatch` (the sbatch-lines test submits such lines from the README
and the notebooks; this page keeps its template out of that path).
"""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTES = ROOT / "notebooks" / "INSTRUCTOR_NOTES.md"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
LAST = "The day before and the morning of"
QUOTE = re.compile(r"the check says\s+`([^`]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
CHECK_IMPORT = re.compile(r"from (source_code(?:\.\w+)+) import [^\n]*\bcheck_\w+")
MODULE_IMPORT = re.compile(r"from (source_code(?:\.\w+)*) import ([\w, ]+?)\s*$", re.M)


def _check_modules(code: str) -> set[str]:
    """The modules whose check_* functions a notebook's code calls (imported by name, or
    through its module: `from source_code.capstone import exercises` ... `exercises.check_x`)."""
    found = set(CHECK_IMPORT.findall(code))
    found |= {f"{package}.{name}" for package, names in MODULE_IMPORT.findall(code)
              for name in (n.strip() for n in names.split(","))
              if name and re.search(rf"\b{name}\.check_\w+\(", code)}
    return found


def _title(nb: Path) -> str:
    first = json.loads(nb.read_text())["cells"][0]["source"]
    return "".join(first).splitlines()[0].lstrip("#").strip()


def _sections() -> dict[str, str]:
    """{heading: body} of the page's `## ` sections, in order."""
    parts = re.split(r"^## (.+)$", NOTES.read_text(), flags=re.M)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}


def _render(node) -> str | None:
    """A string literal as the learner sees it, `…` for every interpolated value (runs of
    adjacent values count as one)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        text = "".join(v.value if isinstance(v, ast.Constant) else "…" for v in node.values)
        return re.sub("…+", "…", text)
    return None


def _strings(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    return [s for s in (_render(n) for n in ast.walk(tree)) if s]


SECTIONS = _sections()


def test_one_section_per_notebook_with_its_exact_title_in_order():
    want = [_title(nb) for nb in NOTEBOOKS]
    assert len(want) >= 20, f"only {len(want)} numbered notebooks found"
    got = list(SECTIONS)
    assert got[:len(want)] == want, (
        "the sections must be the notebooks' first headings, in order; first difference: "
        + next((f"{g!r} vs {w!r}" for g, w in zip(got, want) if g != w), f"{len(got)} sections"))
    assert got[len(want)] == LAST, f"after the notebooks comes {LAST!r}, found {got[len(want)]!r}"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_each_section_links_its_checks_and_quotes_them_verbatim(nb):
    body = SECTIONS[_title(nb)]
    code = "\n".join("".join(c["source"]) for c in json.loads(nb.read_text())["cells"]
                     if c["cell_type"] == "code")
    modules = _check_modules(code)
    assert modules, f"{nb.name}: no check imported from source_code"
    linked = {(NOTES.parent / link).resolve() for link in LINK.findall(body)}
    files = {ROOT / (m.replace(".", "/") + ".py") for m in modules}
    missing = [str(f.relative_to(ROOT)) for f in files if f.resolve() not in linked]
    assert not missing, f"{nb.name}: its section does not link the check file(s) {missing}"
    quotes = QUOTE.findall(body)
    assert len(quotes) >= 2, f"{nb.name}: quote at least two of the check's messages"
    strings = [s for f in files for s in _strings(f)]
    for quote in quotes:
        quote = " ".join(quote.split())
        assert any(quote in " ".join(s.split()) for s in strings), (
            f"{nb.name}: the check says {quote!r}, but no string in "
            f"{sorted(str(f.relative_to(ROOT)) for f in files)} contains it")


def test_every_relative_link_resolves():
    links = LINK.findall(NOTES.read_text())
    assert links, "the page links the checks, tests and notebooks it speaks of"
    broken = [link for link in links if "://" not in link
              and not (NOTES.parent / link.split("#")[0]).exists()]
    assert not broken, f"links that lead nowhere: {broken}"


def test_no_line_starts_with_sbatch():
    lines = [ln for ln in NOTES.read_text().splitlines() if re.match(r"\s*sbatch\b", ln)]
    assert not lines, f"a line that starts with sbatch would read as a course command: {lines}"


def test_no_site_secret_or_typed_account():
    text = NOTES.read_text()
    assert "<reservation>" in text and "<account>" in text, "the template uses placeholders"
    assert not re.search(r"--(account|reservation)=(?!<)", text), "an account or reservation typed in"
