"""Every notebook is also a slide deck (source_code/slides/): the stored slide types are the
rule's, the static decks have the slides the metadata asks for, and a real browser shows them
with nothing from the network: the first slide and a figure slide of each deck, no console error,
the figure loaded.

    python -m pytest tests/test_slides.py -q
"""
from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest

from source_code.slides import export, fit, rules, summary
from source_code.slides.__main__ import main as slides_main, numbered, stale

sys.path.insert(0, str(Path(__file__).parent))
import browser  # noqa: E402

# notebooks being edited elsewhere: their slides are fitted afterwards with
# `python -m source_code.slides.fit --optional ... notebooks/NN_x.ipynb` (README of the slides:
# source_code/slides/fit.py); empty this once they carry the fit
NOT_YET_MARKED: set[str] = set()
NOTEBOOKS = [p for p in numbered() if p.name[:2] not in NOT_YET_MARKED]


def test_stored_slide_types_are_the_rules():
    problems = stale(NOTEBOOKS)
    assert not problems, "\n".join(problems) + "\nfix: python -m source_code.slides --mark " + " ".join(
        f"notebooks/{line.split(':')[0]}" for line in problems)


def _md(text):
    return {"cell_type": "markdown", "metadata": {}, "source": text}


def _code(text, outputs=(), **meta):
    return {"cell_type": "code", "metadata": meta, "source": text, "outputs": list(outputs),
            "execution_count": None}


FIGURE = {"output_type": "display_data", "data": {"image/png": "iVBORw0KGgo=", "text/plain": "<Figure>"},
          "metadata": {}}
PRINTED = {"output_type": "stream", "name": "stdout", "text": "loss 0.1\n"}


def test_the_rule_on_the_anatomy():
    cells = [
        _md("# 07 · Title\n\nAfter this notebook you can ..."),     # title: a slide
        _code("import torch\nfrom source_code import processes"),   # setup: skipped
        _md("## 1. The idea"),                                      # a section: a slide
        _code("fig = plot()", [FIGURE]),                            # its figure, on the same slide
        _md("### A detail"),                                        # a subslide
        _code("x = 1", [PRINTED]),
        _md("\n".join(["an explanation"] * (rules.SCREEN_LINES // 2))),   # still fits
        _md("\n".join(["more"] * (rules.SCREEN_LINES // 2))),     # would not: a new screen
        _md("**Exercise.** Write `f`."),                            # introduces an exercise: a slide
        _code("def f():\n    ...  # TODO", [PRINTED]),
        _code("from source_code.solutions.nb07 import f\nassert check(f)",
              jupyter={"source_hidden": True, "outputs_hidden": True}),   # the reference: skipped
        _md("## Take-aways"),
    ]
    assert rules.slide_types(cells) == [
        "slide", "skip", "slide", "-", "subslide", "-", "-", "subslide", "slide", "-", "skip", "slide"]
    assert rules.counts(rules.slide_types(cells)) == (4, 2)
    # under an exercise section, a further exercise is a subslide of it
    assert rules.slide_types([_md("## 3. Exercises"), _code("a = 1  # TODO"), _md("(b) next"),
                              _code("b = 2  # TODO")]) == ["slide", "-", "subslide", "-"]


def test_mark_writes_only_slide_types_and_is_idempotent(tmp_path):
    original = NOTEBOOKS[0]
    nb = json.loads(original.read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        cell["metadata"].get("slideshow", {}).pop("slide_type", None)     # the fit's flags stay
    bare = tmp_path / original.name
    rules.write(bare, nb)
    assert slides_main(["--check", str(bare)]) == 1
    assert rules.mark(bare) == len(nb["cells"])
    assert bare.read_bytes() == original.read_bytes(), "marking changed more than the slide types"
    assert rules.mark(bare) == 0, "a second --mark changed the notebook"
    assert slides_main(["--check", str(bare)]) == 0


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_no_screen_is_taller_than_the_slide(path):
    """By the rule's height estimate, no screen overflows: every screen counted, one code cell
    alone included (at its printed lines, its figures, a scrolled output at the scrolled area's
    height, a collapsed source at one line)."""
    cells = rules.read(path)["cells"]
    screens = rules.screens(cells)
    over = [(shown[0], h) for shown, h in screens if h > rules.SCREEN_LINES]
    assert not over, (f"{path.name}: {len(over)} of {len(screens)} screens (first cell, lines) over "
                      f"{rules.SCREEN_LINES} lines: {over}; fix: python -m source_code.slides.fit {path}")
    assert all(len(re.findall(r"^#{1,6} ", rules.source(c), re.M)) <= 1 for c in cells
               if c["cell_type"] == "markdown"), f"{path.name}: a cell holds several headings"


def test_heights_count_what_is_shown():
    text = {"output_type": "stream", "name": "stdout", "text": [f"line {i}\n" for i in range(40)]}
    tall = _code("print(...)", [text])
    assert rules.height(tall) == 1 + 40, "every printed line counts"
    tall["metadata"]["scrolled"] = True
    assert rules.height(tall) == 1 + rules.SCROLLED_LINES, "a scrolled output counts at the area's height"
    assert rules.SCROLLED_LINES == 18            # 24em (JupyterLab's max-height) at 1.35em a line
    long = _code("\n".join(f"x{i} = {i}" for i in range(30)), [FIGURE], jupyter={"source_hidden": True})
    assert rules.height(long) == 30 + rules.FIGURE_LINES, "JupyterLab's collapse is not the deck's"
    long["metadata"] = {"slideshow": {"slide_type": "-", rules.SOURCE_ON_SLIDE: rules.COLLAPSED}}
    assert rules.height(long) == 1 + rules.FIGURE_LINES, "a source collapsed on the slide is its one-line bar"
    table = {"output_type": "display_data", "metadata": {},
             "data": {"text/markdown": "| a |\n|---|\n" + "| 1 |\n" * 5, "text/plain": "<Markdown>"}}
    assert rules.height(_code("show()", [table])) == 1 + 7
    # the static deck shows them at the rule's heights: 700 px a screen of SCREEN_LINES lines
    css = (export.TEMPLATE_DIR / export.TEMPLATE / "index.html.j2").read_text(encoding="utf-8")
    px = lambda lines: round(lines * 700 / rules.SCREEN_LINES)
    assert f".reveal .slides img {{ max-height: {px(rules.FIGURE_LINES)}px; }}" in css
    assert re.search(rf"\.workshop-scrolled \{{ max-height: {px(rules.SCROLLED_LINES)}px;", css)


def test_fit_scrolls_tall_outputs_and_collapses_tall_sources_only(tmp_path):
    many = {"output_type": "stream", "name": "stdout", "text": "".join(f"step {i}\n" for i in range(60))}
    lines = lambda n: "\n".join(f"y{i} = {i}" for i in range(n))
    cells = [
        _md("# 96 · Tall\n\nAfter this notebook you can fit.\n\nTime: about 5 minutes instructor-led."),
        _code("import torch"),
        _md("## 1. Outputs"),
        _code(lines(5), [many]),                          # a tall output: scrolled, source shown
        _code(lines(20), [FIGURE, PRINTED]),              # source + figure: the source collapses
        _code(lines(40), [many]),                         # both tall: both
        _code(lines(10), [PRINTED], scrolled=True, jupyter={"source_hidden": True},   # fits: flags off
              slideshow={"slide_type": "-", rules.SOURCE_ON_SLIDE: rules.COLLAPSED}),
        _code(lines(30) + "  # TODO", [PRINTED]),         # an exercise: its source stays open
        _code("from source_code.solutions.nb96 import f", jupyter={"source_hidden": True, "outputs_hidden": True}),
        _md("## Take-aways"),
    ]
    for i, c in enumerate(cells):
        c["id"] = f"c{i}"
    nb = tmp_path / "96_tall.ipynb"
    rules.write(nb, {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5})
    fit.fit(nb)
    once = nb.read_bytes()
    out = rules.read(nb)["cells"]
    flags = [(rules.is_scrolled(c), rules.source_collapsed(c)) for c in out[3:9]]
    assert flags == [(True, False), (False, True), (True, True), (False, False), (False, False), (False, False)], flags
    hidden = [i for i, c in enumerate(out) if c["metadata"].get("jupyter", {}).get("source_hidden")]
    assert hidden == [8], f"JupyterLab's source collapse only on the reference solution: cells {hidden}"
    assert out[8]["metadata"]["jupyter"] == {"source_hidden": True, "outputs_hidden": True}
    assert rules.read(nb)["metadata"]["rise"] == {"scroll": True}, "live RISE scrolls a slide taller than the window"
    assert [(c["source"], c["outputs"]) for c in out if c["cell_type"] == "code"] == \
        [(c["source"], c["outputs"]) for c in cells if c["cell_type"] == "code"], "no source or output changed"
    assert out[8]["metadata"]["slideshow"]["slide_type"] == "skip", "the reference stays skipped"
    over = rules.overflowing(out)
    assert [i for i, _ in over] == [7], f"only the exercise, left open, is taller than a screen: {over}"
    fit.fit(nb)
    assert nb.read_bytes() == once, "a second fit changed the notebook"
    assert slides_main(["--check", str(nb)]) == 1, "--check names the screen left over the height"
    deck = export.export([nb], tmp_path / "deck")[0][0].read_text(encoding="utf-8")
    bars = re.findall(r'<details class="workshop-collapsed"><summary>(?:&hellip;|…) \((\d+) lines of code', deck)
    assert bars == ["20", "40"], f"the deck collapses the flagged sources, and only those: {bars}"
    assert deck.count('<div class="workshop-scrolled">') == 2, "the two scrolled outputs, and only those"


def _fit_case(tmp_path):
    cells = [
        _md("# 97 · Fit\n\nAfter this notebook you can fit.\n\nTime: about 5 minutes instructor-led."),
        _code("import torch"),
        _md("## 1. First\n\nShort.\n\n## 2. Second\n\n" + "\n".join(
            f"Sentence {i} of a long paragraph, with `code` and $x$. And a second sentence." for i in range(14))
            + "\n\n- **A list item.** Its detail."),
        _code("x = 1  # TODO", [PRINTED]),
        _md("## Take-aways\n\nOne."),
    ]
    for i, c in enumerate(cells):
        c["id"] = f"c{i}"
    nb = tmp_path / "97_fit.ipynb"
    rules.write(nb, {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5})
    return nb, cells


def test_fit_splits_headings_moves_long_prose_to_notes_and_is_idempotent(tmp_path):
    nb, cells = _fit_case(tmp_path)
    fit.fit(nb, optional=["Second"])
    once = nb.read_bytes()
    out = rules.read(nb)["cells"]
    kinds = [(rules.source(c).splitlines()[0][:12], c["metadata"]["slideshow"]["slide_type"]) for c in out]
    assert kinds == [("# 97 · Fit", "slide"), ("import torch", "skip"), ("## 1. First", "slide"),
                     ("## 2. Second", "slide"), ("**In brief**", "-"), ("Sentence 0 o", "notes"),
                     ("x = 1  # TOD", "-"), ("## Take-away", "slide")], kinds
    assert [c["metadata"].get("workshop", {}).get("section") for c in out if rules.heading_level(c) == 2] == \
        ["core", "optional", "core"]
    assert [c for c in out if c["cell_type"] == "code"] == [
        dict(c, metadata={"slideshow": {"slide_type": t}}) for c, t in ((cells[1], "skip"), (cells[3], "-"))]
    assert "".join(rules.source(c) for c in out if c["cell_type"] == "markdown" and not rules.is_summary(c)) \
        .replace("\n", "") == "".join(rules.source(c) for c in cells if c["cell_type"] == "markdown") \
        .replace("\n", "").replace("about 5 minutes instructor-led", rules.source(out[0]).split("Time: ")[1][:-1]), \
        "the prose is all still there, in order"
    assert re.search(r"Time: about \d+ minutes instructor-led \(its core sections", rules.source(out[0]))
    assert len({c["id"] for c in out}) == len(out)
    fit.fit(nb, optional=["Second"])
    assert nb.read_bytes() == once, "a second fit changed the notebook"
    fit.fit(nb)                      # without --optional the marks stay
    assert nb.read_bytes() == once


def test_the_summary_is_slide_sized_and_keeps_its_markup_whole():
    text = "\n\n".join([
        "**Bold lead.** The rest, e.g. this; and more. Second sentence here.",
        "```python\nskipped = True\n```",
        "A very long sentence " + "with `a code span` and words " * 12 + "that ends here. Next one.",
        "| a | table |", "- item one, i.e. first. More.\n- item two"] + ["Filler paragraph."] * 10)
    got = summary.summary(text)
    lines = got.splitlines()
    assert lines[0] == summary.LEAD and rules.prose_height(got) <= summary.MAX_LINES + summary.TABLE_LINES
    assert lines[2] == "- **Bold lead.** The rest, e.g. this; and more." and "- item one, i.e. first." in lines, lines
    assert lines[3].endswith(" …") and lines[3].count("`") % 2 == 0 and len(lines[3]) <= summary.BULLET_CHARS + 4
    assert "| a | table |" in lines, "a small table comes along whole"
    assert not any("skipped" in ln for ln in lines), "a code block does not"


def test_fit_works_on_the_notebooks_not_yet_fitted(tmp_path):
    """The command the notebooks being edited elsewhere get afterwards: on a copy of each, no
    screen over the height, no code cell changed."""
    for path in sorted(p for p in numbered() if p.name[:2] in NOT_YET_MARKED):
        copy = tmp_path / path.name
        copy.write_bytes(path.read_bytes())
        fit.fit(copy)
        before, after = (fit._code_cells(rules.read(p)) for p in (path, copy))
        assert before == after, f"{path.name}: a code cell changed"
        assert not rules.overflowing(rules.read(copy)["cells"]), path.name


@pytest.fixture(scope="module")
def decks(tmp_path_factory):
    out = tmp_path_factory.mktemp("slides")
    return out, export.export(NOTEBOOKS, out)


def test_each_deck_has_the_slides_its_metadata_asks_for(decks):
    _, built = decks
    assert len(built) == len(NOTEBOOKS)
    for notebook, (deck, slides, subslides) in zip(NOTEBOOKS, built):
        assert (slides, subslides) == export.expected(notebook), (
            f"{deck.name}: {slides} slides + {subslides} subslides in the HTML, the metadata of "
            f"{notebook.name} asks for {export.expected(notebook)}")
        assert slides >= 4, f"{deck.name}: {slides} slides; the anatomy has at least title, idea, exercise, take-aways"


def test_each_deck_collapses_and_scrolls_the_cells_the_fit_flagged(decks):
    """The slide-only source collapse is a bar in the deck, a scrolled output a scrolling area;
    the notebook keeps every source open but the reference solutions'."""
    _, built = decks
    for notebook, (deck, _, _) in zip(NOTEBOOKS, built):
        html = deck.read_text(encoding="utf-8")
        cells = [c for c in rules.read(notebook)["cells"] if c["cell_type"] == "code"
                 and c["metadata"].get("slideshow", {}).get("slide_type") != rules.SKIP]
        assert html.count('<details class="workshop-collapsed">') == sum(map(rules.source_collapsed, cells)), deck.name
        assert html.count('<div class="workshop-scrolled">') == sum(map(rules.is_scrolled, cells)), deck.name
        hidden = [c for c in cells if c["metadata"].get("jupyter", {}).get("source_hidden")]
        assert not hidden, f"{notebook.name}: a source hidden in the notebook (jupyter.source_hidden) on a slide"


URL = re.compile(r"""<(?:script|link|img|iframe|source)\b[^>]*?\b(?:src|href)=["']([^"']+)""", re.I)


def test_each_deck_carries_its_instructor_notes_as_speaker_notes(decks):
    _, built = decks
    for notebook, (deck, _, _) in zip(NOTEBOOKS, built):
        html = deck.read_text(encoding="utf-8")
        body = export.instructor_notes(notebook)
        assert body, f"{notebook.name}: no section in notebooks/INSTRUCTOR_NOTES.md"
        first = html.index('<aside class="notes">')
        assert first < html.index("</section>", html.index('<div class="slides">')) + 1 + len("</section>") * 2
        plain = re.sub(r"<[^>]+>", "", html[first:html.index("</aside>", first)])
        assert " ".join(body.split("\n\n")[-1].split()[-6:]).replace("`", "").replace("*", "")[:20] in \
            " ".join(plain.split()) or len(plain) > len(body) // 2, f"{deck.name}: its notes are not on the title slide"


def test_decks_load_nothing_from_the_network(decks):
    out, built = decks
    for deck, _, _ in built:
        html = deck.read_text(encoding="utf-8")
        urls = [u for u in URL.findall(html) if not u.startswith(("data:", "#"))]
        assert urls and all(not re.match(r"[a-z]+:", u) and (out / u).is_file() for u in urls), (
            f"{deck.name} loads {urls}: every file a deck loads is written beside it")
        assert not re.search(r"@import|url\((?!\s*['\"]?data:)", html), f"{deck.name}: a style sheet fetches a file"


READY_S = 10


def _show(d, deck: Path):
    d.get(deck.as_uri())
    deadline = time.monotonic() + READY_S
    while not d.execute_script("return !!(window.Reveal && Reveal.isReady())"):
        if time.monotonic() > deadline:
            pytest.fail(f"{deck.name}: reveal.js not ready after {READY_S} s; console: {d.get_log('browser')}")
        time.sleep(0.1)


def test_a_browser_shows_the_first_slide_and_a_figure_of_each_deck(decks, tmp_path):
    reason = browser.why_not_possible()
    if reason:
        pytest.skip(reason)
    out, built = decks
    d = browser.driver(1280, 800)
    try:
        for notebook, (deck, _, _) in zip(NOTEBOOKS, built):
            _show(d, deck)
            title = d.execute_script(
                "const h = Reveal.getCurrentSlide().querySelector('h1'); return h && h.innerText")
            assert title and title.startswith(notebook.name[:2]), f"{deck.name}: first slide shows {title!r}"
            # the first screen that holds a figure: shown, scrolled to, its image decoded
            where = d.execute_script("""
                const s = Reveal.getSlides().find(s => s.querySelector('img'));
                if (!s) return null;
                const i = Reveal.getIndices(s); Reveal.slide(i.h, i.v); return [i.h, i.v];""")
            assert where, f"{deck.name}: no slide shows a figure"
            img = d.execute_script("""
                const img = Reveal.getCurrentSlide().querySelector('img');
                img.scrollIntoView({block: 'center'});
                const r = img.getBoundingClientRect();
                return {natural: img.naturalWidth, complete: img.complete, top: r.top, bottom: r.bottom,
                        width: r.width, height: window.innerHeight,
                        shown: Reveal.getCurrentSlide().classList.contains('present')};""")
            assert img["shown"] and img["complete"] and img["natural"] > 0, f"{deck.name}: figure not loaded: {img}"
            assert img["width"] > 100 and img["bottom"] > 0 and img["top"] < img["height"], \
                f"{deck.name}: the figure at slide {where} is not on screen: {img}"
            if deck is built[0][0]:
                d.save_screenshot(str(tmp_path / "slide.png"))
            severe = [e["message"] for e in d.get_log("browser") if e["level"] == "SEVERE"]
            assert not severe, f"{deck.name}: console errors {severe}"
    finally:
        d.quit()
    print(f"screenshot: {tmp_path / 'slide.png'}")


def test_a_missing_notebook_is_refused_in_one_line(capsys):
    with pytest.raises(SystemExit) as err:
        slides_main(["--check", "notebooks/no_such.ipynb"])
    assert err.value.code == 2 and "not a notebook file" in str(err.value)
