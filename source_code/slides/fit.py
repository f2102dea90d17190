"""Make a notebook's slides fit the screen, and mark its sections core or optional.

    python -m source_code.slides.fit notebooks/06_launching.ipynb
    python -m source_code.slides.fit --optional "Inside DDP" --optional "Validation" notebooks/05_ddp.ipynb

Idempotent: a second run changes nothing. It touches markdown cells and cell metadata only
(no code cell, no output):
- a markdown cell that holds several headings is split, one cell per heading;
- prose taller than rules.PROSE_LINES leaves the slide: its heading line becomes a cell of its
  own, the prose becomes RISE's speaker `notes`, and a slide-sized summary (the lead sentence of
  each paragraph, tagged `"workshop": {"summary": true}` and rebuilt from the prose on every
  run) takes its place on the slide; the notebook reads on as before, the summary first;
- every `## ` heading cell is marked core or optional (`--optional TEXT`: the headings that
  contain TEXT, the others core; without it, the marks already there stay, new ones are core);
- the first cell's "about N minutes instructor-led" is the core sections' time that
  source_code/course_plan.py computes, with the optional ones' minutes beside it;
- a code cell taller than a screen alone gets display flags, nothing else: its output area
  scrolled (`"scrolled": true`, JupyterLab's own flag) where that makes it fit with its source
  shown, else its source collapsed on the slide only (`metadata.slideshow.source_on_slide:
  "collapsed"`: the exported deck shows a bar the presenter clicks to open; JupyterLab ignores
  the key, so the notebook shows the code in full), and both where the output is still too
  tall; a cell that fits has neither (both flags are the fit's: set or cleared on every run; a
  reference solution's cell, source and output collapsed in the notebook, is left alone, an
  exercise's source is never collapsed, and `jupyter.source_hidden` is never written: the fit
  removes it from any other cell);
- the notebook's `metadata.rise.scroll` is true: live RISE (jupyterlab-rise) then gives a slide
  taller than the window a scroll bar;
- the slide types are the rule's (rules.py), as `python -m source_code.slides --mark` writes them.
The stored outputs stay as they are: re-executing the notebook is not needed.

    python -m source_code.slides.fit               # every numbered notebook
"""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path

from source_code import course_plan
from source_code.cli import Parser
from source_code.errors import LaunchError, run_main
from source_code.slides import rules
from source_code.slides.summary import summary

KEY = course_plan.KEY
FENCE = re.compile(r"^\s*(```|~~~)")
TIME = re.compile(r"about \d+ min(?:utes)? (?:in an )?instructor-led(?: session)?(?: \([^)]*\))?"
                  r"|instructor-led about \d+ min(?:utes)?")


def _split_at_headings(text: str) -> list[str]:
    """The cell's text cut before every heading line outside a code fence."""
    parts, current, fenced = [], [], False
    for line in text.splitlines(keepends=True):
        if FENCE.match(line):
            fenced = not fenced
        if not fenced and rules.HEADING.match(line) and "".join(current).strip():
            parts.append("".join(current))
            current = []
        current.append(line)
    parts.append("".join(current))
    return [p.rstrip("\n") for p in parts if p.strip()]


def _cell(text: str, like: dict, suffix: str, **meta) -> dict:
    cell = {"cell_type": "markdown", "metadata": {k: copy.deepcopy(v) for k, v in like["metadata"].items()
                                                   if k not in ("slideshow", KEY)}, "source": text}
    if "id" in like:
        cell["id"] = (like["id"] + suffix)[-64:]
    cell["metadata"].update(meta)
    return {k: cell[k] for k in ("cell_type", "id", "metadata", "source") if k in cell}


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def _paragraphs(cell: dict) -> list[dict]:
    """A cell taller than a screen cut between paragraphs (outside code fences), one cell each,
    so that the rule can start a screen between them."""
    text = rules.source(cell)
    if rules.prose_height(text) <= rules.SCREEN_LINES:
        return [cell]
    chunks, current, fenced = [], [], False
    for line in text.splitlines(keepends=True):
        if FENCE.match(line):
            fenced = not fenced
        if not fenced and not line.strip() and "".join(current).strip():
            chunks.append("".join(current).strip("\n"))
            current = []
            continue
        current.append(line)
    chunks.append("".join(current).strip("\n"))
    cell["source"] = _lines(chunks[0])
    return [cell] + [dict(_cell("", cell, f"-t{k}"), source=_lines(c)) for k, c in enumerate(chunks[1:], 1) if c]


def restructure(cells: list[dict]) -> list[dict]:
    """Split cells at headings, put long prose into notes behind a summary (see the docstring)."""
    out, opening = [], True
    for n, cell in enumerate(c for c in cells if not (c["cell_type"] == "markdown" and course_plan.mark(c).get("summary"))):
        opening = opening and not re.search(r"^## ", rules.source(cell), re.M)
        if cell["cell_type"] != "markdown" or (opening and n):
            out.append(cell)
            continue
        parts = _split_at_headings(rules.source(cell))
        for k, part in enumerate(parts):
            piece = cell if k == 0 else _cell("", cell, f"-h{k}")
            piece["source"] = _lines(part)
            first, _, rest = part.partition("\n")
            if n == 0:   # the title cell: its outcomes, prerequisites and time stay on slides
                out += _paragraphs(piece)
                continue
            if rules.HEADING.match(first) and rest.strip() and rules.prose_height(rest) > rules.PROSE_LINES:
                piece["source"] = _lines(first)     # the heading stays on the slide, alone
                out.append(piece)
                piece = _cell(rest.strip("\n"), cell, f"-p{k}")
                piece["source"] = _lines(rest.strip("\n"))
                piece["metadata"].pop(KEY, None)
            out.append(piece)
            if rules.is_long_prose(piece):
                out.insert(len(out) - 1, _cell("", piece, "-s", **{KEY: {"summary": True}}))
                out[-2]["source"] = _lines(summary(rules.source(piece)))
    return out


def mark_sections(cells: list[dict], optional: list[str] | None) -> None:
    for cell in cells:
        if rules.heading_level(cell) != 2 or course_plan.mark(cell).get("summary"):
            continue
        title = rules.source(cell).splitlines()[0].lower()
        meta = cell["metadata"].setdefault(KEY, {})
        if optional is not None:
            meta["section"] = course_plan.OPTIONAL if any(t.lower() in title for t in optional) else course_plan.CORE
        else:
            meta.setdefault("section", course_plan.CORE)


def state_time(path: Path, nb: dict) -> None:
    """Write the computed minutes into the first cell's time line (twice: the line's own words count)."""
    for _ in range(3):
        secs = course_plan.sections(nb["cells"], course_plan.readme_seconds().get(path.name[:2]))
        core = course_plan.slot(sum(s["minutes"] for s in secs if s["kind"] == course_plan.CORE))
        extra = course_plan.slot(sum(s["minutes"] for s in secs if s["kind"] == course_plan.OPTIONAL))
        said = (f"about {core} minutes instructor-led (its core sections, exercises included"
                + (f"; {extra} more with the optional ones)" if extra else ")"))
        opening = [c for c in nb["cells"][:8] if c["cell_type"] == "markdown" and TIME.search(rules.source(c))]
        if not opening:
            raise LaunchError(f"error: {path.name}'s first cells state no 'about N minutes instructor-led'; add it")
        first = rules.source(opening[0])
        new = TIME.sub(said, first, count=1)
        if new == first:
            return
        opening[0]["source"] = _lines(new)


def _set(meta: dict, scrolled: bool, collapsed: bool) -> None:
    """The fit's two display flags, each changed in place (the stored order of keys stays), and
    JupyterLab's own source collapse removed (only a reference solution's cell keeps it)."""
    if scrolled:
        meta["scrolled"] = True
    else:
        meta.pop("scrolled", None)
    if collapsed:
        meta.setdefault("slideshow", {})[rules.SOURCE_ON_SLIDE] = rules.COLLAPSED
    else:
        meta.get("slideshow", {}).pop(rules.SOURCE_ON_SLIDE, None)
    if "source_hidden" in meta.get("jupyter", {}):
        del meta["jupyter"]["source_hidden"]
        if not meta["jupyter"]:
            del meta["jupyter"]


def fit_tall_cells(cells: list[dict]) -> None:
    """Scroll the output, else collapse the source, of each shown code cell taller than a screen
    (see the docstring); the flags are decided from the cell as it is without them."""
    shown = [t != rules.SKIP for t in rules.slide_types(cells)]
    for cell, on_slide in zip(cells, shown):
        if cell["cell_type"] != "code" or rules.is_collapsed(cell):
            continue
        if not on_slide:      # not on a slide: nothing to collapse there
            _set(cell["metadata"], rules.is_scrolled(cell), False)
            continue
        src = len(rules.source(cell).splitlines() or [""])
        out = rules.output_height(cell)
        scroll_fits = out > rules.SCROLLED_LINES and src + rules.SCROLLED_LINES <= rules.SCREEN_LINES
        if src + out <= rules.SCREEN_LINES:
            _set(cell["metadata"], False, False)
        elif rules.is_exercise(cell):     # a learner's cell: its source stays open
            _set(cell["metadata"], out > rules.SCROLLED_LINES, False)
        elif scroll_fits:
            _set(cell["metadata"], True, False)
        else:
            _set(cell["metadata"], 1 + out > rules.SCREEN_LINES, True)


def _code_cells(nb: dict) -> list[dict]:
    """The code cells as they run: sources, outputs and metadata but the display flags."""
    out = []
    for c in (c for c in nb["cells"] if c["cell_type"] == "code"):
        c = copy.deepcopy(c)
        c["metadata"].pop("slideshow", None)
        if not rules.is_collapsed(c):
            _set(c["metadata"], False, False)
        out.append(c)
    return out


def fit(path: Path, optional: list[str] | None = None) -> int:
    """Fit the notebook at `path`; returns how many cells it now has more than before."""
    nb = rules.read(path)
    before = copy.deepcopy(nb)
    code = _code_cells(nb)
    for _ in range(3):   # until stable: the time line written may make the title cell taller
        cells = nb["cells"]
        nb["cells"] = restructure(copy.deepcopy(cells))
        mark_sections(nb["cells"], optional)
        state_time(path, nb)
        if nb["cells"] == cells:
            break
    fit_tall_cells(nb["cells"])
    nb["metadata"].setdefault("rise", {})["scroll"] = True     # live RISE scrolls a tall slide
    for cell, kind in zip(nb["cells"], rules.slide_types(nb["cells"])):
        show = cell["metadata"].setdefault("slideshow", {})      # slide_type last, as --mark writes it
        flags = {k: v for k, v in show.items() if k != "slide_type"}
        show.clear()
        show.update(flags, slide_type=kind)
    order = {c.get("id"): list(c["metadata"]) for c in before["cells"]}
    for cell in nb["cells"]:      # a rebuilt cell keeps its metadata in the stored order: no noise
        keys = [k for k in order.get(cell.get("id"), []) if k in cell["metadata"]]
        cell["metadata"] = {k: cell["metadata"][k] for k in keys + [k for k in cell["metadata"] if k not in keys]}
    if _code_cells(nb) != code:
        raise LaunchError(f"error: fitting {path.name} would change a code cell; nothing written")
    if json.dumps(nb) != json.dumps(before):     # the order of keys counts: the bytes stored
        rules.write(path, nb)
    return len(nb["cells"]) - len(before["cells"])


def main(argv=None) -> int:
    p = Parser(prog="python -m source_code.slides.fit", description=__doc__.splitlines()[0])
    p.add_argument("--optional", action="append", metavar="TEXT",
                   help="a `## ` heading that contains TEXT is an optional section (repeat it)")
    p.add_argument("notebooks", nargs="*", help="notebook files (default: every numbered notebook)")
    args = p.parse_args(argv)
    from source_code.slides.__main__ import notebooks
    for path in notebooks(args.notebooks):
        added = fit(path, args.optional)
        cells = rules.read(path)["cells"]
        flags = [sum(f(c) for c in cells if c["cell_type"] == "code" and not rules.is_collapsed(c))
                 for f in (rules.is_scrolled, rules.source_collapsed)]
        print(f"{path.name}: {added} cells added, {len(rules.overflowing(cells))} screens over "
              f"{rules.SCREEN_LINES} lines; outputs scrolled in {flags[0]} cells, "
              f"sources collapsed on the slide in {flags[1]}")
    return 0


if __name__ == "__main__":
    run_main(main)
