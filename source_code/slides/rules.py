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

A cell's height is what the slide shows of it: its source lines (one line where the fit
collapsed the source on the slide: `metadata.slideshow.source_on_slide == "collapsed"`, a key
only the exported deck reads, shown there as a bar that opens on a click; the notebook, and live
RISE, show the code in full), FIGURE_LINES a figure, the printed lines as printed (wrapped at
WRAP); an output area marked `"scrolled": true` (JupyterLab's "Enable Scrolling for Outputs",
which RISE keeps: max-height 24em, then a scroll bar) counts at most SCROLLED_LINES. fit.py sets
those two flags where a code cell is taller than a screen alone, and the notebook's
`metadata.rise.scroll` so that live RISE scrolls a slide taller than the window. A re-run that
prints more lines can move a boundary: `--check` then says so.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

SLIDE, SUBSLIDE, CONTINUE, SKIP, NOTES = "slide", "subslide", "-", "skip", "notes"
# what fits on one reveal.js slide of the export: 960 x 700, whose template (template/) sets the
# type so that a line of WRAP characters takes at most 700/26 px (prose 16 px on 25 px lines,
# printed text 14 px on 20, code 11 px on 13, a figure at most FIGURE_LINES lines)
SCREEN_LINES = 26
FIGURE_LINES = 16     # a figure's height, in lines of text
WRAP = 100            # characters of markdown (or printed text) on one line of a slide
LINE_EM = 1.35        # a line of text, in em of its type (JupyterLab's output line-height 1.3, rounded up)
# JupyterLab's scrolled output area: `.jp-mod-outputsScrolled .jp-Cell-outputArea {max-height: 24em}`
# (@jupyterlab/cells style/widget.css, also in jupyterlab-rise's bundle), in lines of the slide
SCROLLED_LINES = math.ceil(24 / LINE_EM)
PROSE_LINES = 10      # prose taller than this goes to the speaker notes, behind a summary (fit.py)
KEY = "workshop"      # cell metadata of the course tools: {"summary": true} on a slide's summary
# the slide-only flag of a code cell whose source the deck collapses (JupyterLab ignores it)
SOURCE_ON_SLIDE, COLLAPSED = "source_on_slide", "collapsed"

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
    """Source and output both collapsed (the reference solution's cell): nothing to show."""
    flags = cell["metadata"].get("jupyter", {})
    return bool(flags.get("source_hidden") and flags.get("outputs_hidden"))


def source_collapsed(cell: dict) -> bool:
    """The source collapsed on the slide only (the notebook shows it): the fit's flag."""
    return cell["metadata"].get("slideshow", {}).get(SOURCE_ON_SLIDE) == COLLAPSED


def is_scrolled(cell: dict) -> bool:
    return cell["metadata"].get("scrolled") is True


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


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def output_height(cell: dict) -> int:
    """The lines a code cell's outputs take, unscrolled: FIGURE_LINES a figure, a table or a
    text as rendered (wrapped at WRAP), an error's traceback."""
    lines = 0
    for o in cell.get("outputs", []):
        data = o.get("data", {})
        if {"image/png", "image/svg+xml", "image/jpeg"} & set(data):
            lines += FIGURE_LINES
        elif o.get("output_type") == "stream":
            lines += prose_height(_text(o.get("text", "")).rstrip("\n"))
        elif o.get("output_type") == "error":
            lines += prose_height(re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(o.get("traceback", []))))
        elif "text/markdown" in data:
            lines += prose_height(_text(data["text/markdown"]).strip("\n"))
        elif "text/plain" in data:
            lines += prose_height(_text(data["text/plain"]).rstrip("\n"))
    return lines


def source_height(cell: dict) -> int:
    return 1 if source_collapsed(cell) else len(source(cell).splitlines() or [""])


def height(cell: dict) -> int:
    """A cell's height on a slide, in lines of text (see the docstring)."""
    if cell["cell_type"] != "code":
        return prose_height(source(cell))
    out = output_height(cell)
    return source_height(cell) + (min(out, SCROLLED_LINES) if is_scrolled(cell) else out)


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
    """(first cell, height) of every screen taller than SCREEN_LINES, one cell alone included."""
    return [(shown[0], h) for shown, h in screens(cells) if h > SCREEN_LINES]


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
