"""Every notebook is also a slide deck: slide boundaries in the cells' `metadata.slideshow`.

    python -m source_code.slides.fit [notebooks/05_ddp.ipynb ...]    # fit the slides (fit.py), and mark
    python -m source_code.slides --mark notebooks/05_ddp.ipynb ...   # write the rule's slide types
    python -m source_code.slides --check                             # stale types, tall screens? (exit 1)
    python -m source_code.slides --export slides                     # slides/NN_name.slides.html
    make slides                                                      # the same export

Live: in JupyterLab (`make lab`), open a notebook and press Alt+R (or the notebook toolbar's
"Render the current notebook as Reveal Slideshow"): RISE (jupyterlab-rise) presents it from the
same cells, offline; a slide taller than the window scrolls (mouse wheel or the scroll bar),
and a code cell collapsed in the exported deck shows its source whole.
Static: `--export` writes one reveal.js deck per notebook for presenting from a browser; the
files it needs come from the installed jupyterlab-rise, nothing is fetched.
Where the boundaries go is one rule (rules.py), applied by `--mark` and idempotent; `--check`
(run by tests/test_slides.py) names the notebooks whose stored types the rule would change.
What makes a screen fit is fit.py: one heading a cell, long prose in the speaker notes (RISE's
`notes`) behind a slide-sized summary (summary.py), a code cell taller than a screen with its
output scrolled (JupyterLab's `"scrolled"`) or its source collapsed on the slide only
(`metadata.slideshow.source_on_slide`: the notebook still shows the code), live RISE's slide
scrolling on (`metadata.rise.scroll`), the sections marked core or optional for
source_code/course_plan.py. `--check` also names every screen taller than the slide by the
rule's estimate (fix: `python -m source_code.slides.fit`, every notebook). Speaker notes (S in
the deck, or RISE's speaker view): those notes, and on the title slide of each exported deck the notebook's section of INSTRUCTOR_NOTES.md.
"""
