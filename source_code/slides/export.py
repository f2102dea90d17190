"""Static HTML decks of the notebooks: nbconvert's reveal.js slides, readable with no network.

One deck per notebook (`NN_name.slides.html`) and reveal.js beside them (`reveal/`, from
jupyterlab-rise: reveal_assets.py); the notebooks are not executed, the decks show their stored
outputs and figures. Open a deck in any browser, from the disk (file://) or a web server.
Speaker notes (press S): the prose that fit.py moved off the slides (the `notes` cells), and on
the title slide the notebook's section of notebooks/INSTRUCTOR_NOTES.md (questions, the
exercise's mistakes, what to run live), read from that page at export time: one copy of it.
"""
from __future__ import annotations

import re
from pathlib import Path

from source_code.slides import reveal_assets, rules

TEMPLATE_DIR = Path(__file__).resolve().parent / "template"
INSTRUCTOR_NOTES = Path(__file__).resolve().parents[2] / "notebooks" / "INSTRUCTOR_NOTES.md"
TEMPLATE = "workshop_reveal"
ASSETS = "reveal"     # the folder next to the decks that holds reveal.js


def exporter():
    from nbconvert import SlidesExporter
    return SlidesExporter(extra_template_basedirs=[str(TEMPLATE_DIR)], template_name=TEMPLATE,
                          reveal_url_prefix=ASSETS, reveal_theme="white", reveal_transition="none",
                          reveal_number="c/t", reveal_scroll=True)


def deck_name(notebook: Path) -> str:
    return Path(notebook).stem + ".slides.html"


def export(notebooks: list[Path], out: Path) -> list[tuple[Path, int, int]]:
    """Write one deck per notebook into `out`, and reveal.js into `out/reveal/`;
    returns (deck, slides, subslides) for each, counted in the HTML written."""
    import nbformat
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    reveal_assets.write(out / ASSETS)
    ex = exporter()
    decks = []
    for path in notebooks:
        nb = nbformat.read(str(path), as_version=4)
        html, _ = ex.from_notebook_node(nb, resources={"metadata": {"name": Path(path).stem}})
        html = with_speaker_notes(html, instructor_notes(path))
        deck = out / deck_name(path)
        deck.write_text(html, encoding="utf-8")
        decks.append((deck, *sections(html)))
    return decks


def instructor_notes(notebook: Path, page: Path | None = None) -> str:
    """The notebook's section of the instructor's notes (titled as its first heading), Markdown;
    empty when the page has none."""
    page = Path(page or INSTRUCTOR_NOTES)
    if not page.is_file():
        return ""
    title = rules.source(rules.read(notebook)["cells"][0]).splitlines()[0].lstrip("#").strip()
    parts = re.split(r"^## (.+)$", page.read_text(encoding="utf-8"), flags=re.M)
    return next((parts[i + 1].strip() for i in range(1, len(parts), 2) if parts[i].strip() == title), "")


def with_speaker_notes(html: str, notes_md: str) -> str:
    """The deck with `notes_md` as the speaker notes of its title slide (its first screen)."""
    if not notes_md:
        return html
    from nbconvert.filters.markdown import markdown2html
    start = html.index('<div class="slides">')
    first = SECTION.search(html, start)               # the first slide
    inner = SECTION.search(html, first.end())         # its first screen
    at = html.index("</section>", inner.end())
    aside = f'<aside class="notes">\n{markdown2html(notes_md)}\n</aside>\n'
    return html[:at] + aside + html[at:]


SECTION = re.compile(r"<section\b[^>]*>|</section>")


def sections(html: str) -> tuple[int, int]:
    """(slides, subslides beyond each slide's first screen) in a deck's HTML: a slide is a
    top-level <section>, each of its screens a <section> inside it (as nbconvert nests them)."""
    body = html[html.index('<div class="slides">'):]
    depth, slides, screens = 0, 0, 0
    for tag in SECTION.findall(body):
        if tag == "</section>":
            depth -= 1
            continue
        depth += 1
        if depth == 1:
            slides += 1
        elif depth == 2:
            screens += 1
    return slides, screens - slides


def expected(notebook: Path) -> tuple[int, int]:
    """(slides, subslides) the notebook's stored slide types ask for."""
    return rules.counts(rules.stored_types(rules.read(notebook)["cells"]))
