"""Where a notebook's slides begin: one rule, written into each cell's `metadata.slideshow`.

The rule follows the notebook anatomy (../shared/design.md): the title cell and every `##`
section (the idea and its figure, the key lines, the measured claims, the exercise, the
take-aways) start a slide; a `###` heading, an exercise inside a section, and a section taller
than a screen start a subslide (reveal.js shows subslides below their slide, so a section stays
one column). The setup cell after the title (imports and helpers) and the collapsed cell that
runs a reference solution are skipped: bookkeeping, and a solution is never on a slide. Every
other cell continues the slide it is on ("-": no fragments, one keystroke per slide).

Prose that fit.py moved behind a slide-sized summary (the cell after a summary cell, taller
than PROSE_LINES) is the speaker's `notes`: it takes no room on the slide.

The rule reads only the sources, the collapsed flags and whether a cell draws a figure or
prints at all, never the printed text itself: re-running a notebook changes no boundary.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

SLIDE, SUBSLIDE, CONTINUE, SKIP, NOTES = "slide", "subslide", "-", "skip", "notes"
# what fits on one reveal.js slide of the export (960 x 700 at the template's 20 px type)
SCREEN_LINES = 26
FIGURE_LINES = 16     # a figure's height, in lines of text
PRINTED_LINES = 4     # a cell's printed lines, whatever they say (see the docstring)
WRAP = 100            # characters of markdown on one line of a slide
PROSE_LINES = 10      # prose taller than this goes to the speaker notes, behind a summary (fit.py)
KEY = "workshop"      # cell metadata of the course tools: {"summary": true} on a slide's summary

HEADING = re.compile(r"(#{1,6}) ")


def source(cell: dict) -> str:
    return "".join(cell["source"])


def heading_level(cell: dict) -> int:
    """1 for `# Title`, 2 for `## Section`, ...; 0 for a markdown cell without a heading."""
    if cell["cell_type"] != "markdown":
        return 0
    m = HEADING.match(source(cell).lstrip())
    return len(m[1]) if m else 0


def is_exercise(cell: dict) -> bool:
    """The cell a learner completes (the same test as the participants' set uses)."""
    return cell["cell_type"] == "code" and "TODO" in source(cell)


def is_collapsed(cell: dict) -> bool:
    return bool(cell["metadata"].get("jupyter", {}).get("source_hidden"))


def draws_figure(cell: dict) -> int:
    return sum(1 for o in cell.get("outputs", [])
               if {"image/png", "image/svg+xml", "image/jpeg"} & set(o.get("data", {})))


def prose_height(text: str) -> int:
    return sum(1 + len(line) // WRAP for line in (text.splitlines() or [""]))


def is_summary(cell: dict) -> bool:
    return cell["cell_type"] == "markdown" and bool(cell["metadata"].get(KEY, {}).get("summary"))


def is_long_prose(cell: dict) -> bool:
    """Prose too tall for a slide beside anything else (fit.py puts it into the notes)."""
    return (cell["cell_type"] == "markdown" and not is_summary(cell) and heading_level(cell) == 0
            and prose_height(source(cell)) > PROSE_LINES)


def height(cell: dict) -> int:
    """A cell's height on a slide, in lines of text (an estimate from what the rule may read)."""
    lines = source(cell).splitlines() or [""]
    if cell["cell_type"] == "markdown":
        return prose_height(source(cell))
    figures = draws_figure(cell)
    prints = any(o.get("output_type") in ("stream", "execute_result", "error")
                 or "text/plain" in o.get("data", {}) and not figures for o in cell.get("outputs", []))
    return len(lines) + FIGURE_LINES * figures + PRINTED_LINES * prints


def slide_types(cells: list[dict]) -> list[str]:
    """The slide type of every cell of a notebook, by the rule above."""
    types: list[str] = []
    in_title = True          # before the first `##` section: the title and its setup cell
    section = ""             # the heading of the slide we are on
    tall = 0                 # lines on the current (sub)slide so far
    prev_code = False        # the last cell on a slide was code
    for i, cell in enumerate(cells):
        level = heading_level(cell)
        if level == 2:
            in_title = False
        if cell["cell_type"] == "code" and (is_collapsed(cell) or in_title):
            types.append(SKIP)
            continue
        if i and is_long_prose(cell) and is_summary(cells[i - 1]):
            types.append(NOTES)   # the prose, behind its summary: the speaker's notes
            continue
        h = height(cell)
        nxt = next((c for c in cells[i + 1:] if not is_collapsed(c)), None)
        introduces_exercise = (is_exercise(cell) and prev_code) or (
            cell["cell_type"] == "markdown" and nxt is not None and is_exercise(nxt))
        if level in (1, 2):
            kind = SLIDE
            section = source(cell).splitlines()[0]
        elif level == 3:
            kind = SUBSLIDE
        elif introduces_exercise:
            kind = SUBSLIDE if "exercise" in section.lower() else SLIDE
            section = section if kind == SUBSLIDE else "exercise"
        elif tall and tall + h > SCREEN_LINES:
            kind = SUBSLIDE   # a new screen
        else:
            kind = CONTINUE
        tall = h if kind in (SLIDE, SUBSLIDE) else tall + h
        prev_code = cell["cell_type"] == "code"
        types.append(kind)
    return types


def screens(cells: list[dict]) -> list[tuple[list[int], int]]:
    """(the cells shown, height in lines) of every screen, read from the stored slide types
    (skipped cells and notes take no room)."""
    out: list[tuple[list[int], int]] = []
    for i, (cell, kind) in enumerate(zip(cells, stored_types(cells))):
        if kind in (SKIP, NOTES):
            continue
        if kind in (SLIDE, SUBSLIDE) or not out:
            out.append(([], 0))
        out[-1][0].append(i)
        out[-1] = (out[-1][0], out[-1][1] + height(cell))
    return out


def overflowing(cells: list[dict]) -> list[tuple[int, int]]:
    """(first cell, height) of every screen taller than SCREEN_LINES that a boundary could cut:
    one that shows more than one cell. A single cell taller than a screen (a code cell with its
    figure, shown whole: the deck scrolls it) is counted by tall_cells."""
    return [(shown[0], h) for shown, h in screens(cells) if h > SCREEN_LINES and len(shown) > 1]


def tall_cells(cells: list[dict]) -> list[tuple[int, int]]:
    """(cell, height) of every cell shown alone on a screen because it is taller than one."""
    return [(shown[0], h) for shown, h in screens(cells) if h > SCREEN_LINES and len(shown) == 1]


def stored_types(cells: list[dict]) -> list[str | None]:
    return [c["metadata"].get("slideshow", {}).get("slide_type") for c in cells]


def counts(types: list[str | None]) -> tuple[int, int]:
    """(slides, subslides beyond each slide's first screen) that reveal.js shows for these slide
    types, as nbconvert reads them: the first cell shown always starts a slide."""
    shown = [t or CONTINUE for t in types if t != SKIP]
    if not shown:
        return 0, 0
    return 1 + shown[1:].count(SLIDE), shown[1:].count(SUBSLIDE)


def read(path: Path) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def write(path: Path, nb: dict) -> None:
    """As the notebooks are stored: indent 1, UTF-8 as is, a trailing newline."""
    Path(path).write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def stale_cells(nb: dict) -> list[int]:
    """Indices of the cells whose stored slide type is missing or not the rule's."""
    return [i for i, (want, have) in enumerate(zip(slide_types(nb["cells"]), stored_types(nb["cells"])))
            if want != have]


def mark(path: Path) -> int:
    """Write the rule's slide type into every cell of the notebook at `path` (sources and outputs
    untouched); returns how many cells changed (0 the second time)."""
    nb = read(path)
    changed = stale_cells(nb)
    if changed:
        for cell, kind in zip(nb["cells"], slide_types(nb["cells"])):
            cell["metadata"].setdefault("slideshow", {})["slide_type"] = kind
        write(path, nb)
    return len(changed)
