"""A slide-sized summary of a block of prose: the lead sentence of each paragraph, as bullets.

The prose itself stays in the notebook (as the slide's speaker notes, fit.py); the summary is
what the room reads while the instructor talks it through. It keeps the markup whole (a
sentence is cut only where its backticks, dollars and asterisks are balanced) and holds at most
MAX_LINES lines of a slide, BULLET_CHARS characters a bullet; a table of the prose that fits
(TABLE_LINES more) comes along whole: a table is what a slide shows best.
"""
from __future__ import annotations

import re

MAX_LINES = 7
TABLE_LINES = 6       # a small table may take this many lines more
BULLET_CHARS = 180
LEAD = "**In brief**"
# a sentence ends at . ! or ? before a space and a capital, a backtick, a quote or a bracket,
# not after e.g., i.e., vs., cf. or a single capital (initials)
END = re.compile(r"(?<!\be\.g)(?<!\bi\.e)(?<!\bvs)(?<!\bcf)(?<!\bal)(?<!\b[A-Z])(?<!\.)[.!?](?!\.)(?=\s+[A-Z`*(\[\"'$])")
SKIPPED = re.compile(r"^\s*(```|~~~|\||\$\$|<|!\[|>|#)")
ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")


def _balanced(text: str) -> bool:
    plain = re.sub(r"`[^`]*`", "", text)
    return text.count("`") % 2 == 0 and plain.count("$") % 2 == 0 and plain.count("**") % 2 == 0 \
        and plain.count("[") == plain.count("]") and plain.count("(") == plain.count(")")


def _shorten(sentence: str, limit: int) -> str:
    if len(sentence) <= limit:
        return sentence
    for stop in (r"[;:,] ", r" "):   # a clause, else a word, with its markup whole
        cuts = [m.start() for m in re.finditer(stop, sentence[:limit])]
        for cut in reversed(cuts):
            if cut > limit // 3 and _balanced(sentence[:cut]):
                return sentence[:cut].rstrip(" ,;:") + " …"
    return ""


def _blocks(text: str) -> list[str]:
    """Paragraphs (blank-line separated), a fenced block whole, each list item on its own."""
    blocks, current, fenced = [], [], False
    for line in text.splitlines():
        if re.match(r"^\s*(```|~~~)", line):
            fenced = not fenced
        if not fenced and (not line.strip() or ITEM.match(line)) and current:
            blocks.append("\n".join(current))
            current = []
        if line.strip() or fenced:
            current.append(line)
    if current:
        blocks.append("\n".join(current))
    return blocks


def lead_sentence(block: str) -> str:
    flat = " ".join(ITEM.sub("", block, count=1).split())
    m = END.search(flat)
    sentence = flat[:m.end()] if m and _balanced(flat[:m.end()]) else flat
    return sentence     # a lead that ends in a colon keeps it: the bullets after it are its list


def summary(text: str) -> str:
    """The summary of `text` (Markdown), at most MAX_LINES lines."""
    bullets, lines = [], 1
    for block in _blocks(text):
        if block.lstrip().startswith("|"):     # a table that fits stays whole: it is the slide's content
            need = 1 + sum(1 + len(row) // 100 for row in block.splitlines())
            if lines + need <= MAX_LINES + TABLE_LINES:
                bullets.append("\n" + block + "\n")
                lines += need
            continue
        if SKIPPED.match(block):
            continue
        bullet = _shorten(lead_sentence(block), BULLET_CHARS)
        if not bullet:
            continue
        need = 1 + len(bullet) // 100
        if lines + need > MAX_LINES:
            break
        bullets.append(f"- {bullet}")
        lines += need
    return ("\n".join([LEAD, "", *bullets]).strip("\n").replace("\n\n\n", "\n\n") if bullets
            else LEAD + "\n\n- (see the notes)")
