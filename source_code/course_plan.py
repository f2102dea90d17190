"""The course plan: one-, two- and three-day agendas built from the notebooks' core sections.

    python -m source_code.course_plan                 # print the plan (Markdown)
    python -m source_code.course_plan --write         # rewrite notebooks/COURSE_PLAN.md

Every `## ` section of a notebook is core or optional: its heading cell's metadata says which
(`"workshop": {"section": "optional"}`; unmarked is core, as is the title and setup before the
first section). `python -m source_code.slides.fit --optional TEXT notebooks/NN_x.ipynb` writes
the marks. A section's time is computed, never typed: its prose at WORDS_PER_MINUTE (the
slide-sized summaries left out: they repeat the prose), its code cells' stored run times
(brought to the pace of the README's quiet run of the notebook, when it has one) and an
EXERCISE_MINUTES slot for every exercise cell (the one with the `TODO`). A notebook's agenda
slot is its core sections, rounded up to 5 minutes; the optional ones are listed under the day
that skips them. The plan changes when the notebooks do (tests/test_course_plan.py fails until
the page is rewritten, and when a day does not fit). A day starts at 09:00 and places the
notebooks in teaching order, with coffee at 10:30 and 14:45 and lunch at 12:15: a notebook that
would run past a break by at most a quarter of an hour ends first (the break moves), a longer
one is split by it; a closing half hour ends the day, by 17:00.
"""
from __future__ import annotations

import json
import math
import re
from datetime import datetime
from pathlib import Path

from source_code.cli import Parser
from source_code.errors import LaunchError, run_main
from source_code.slides import rules

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
PAGE = NOTEBOOKS / "COURSE_PLAN.md"
# an `sbatch ...` line as printed in a notebook or the README: the job script's path or a --wrap
# command, with the variables set before it (tests/test_sbatch_lines.py submits what it matches)
SBATCH_LINE = re.compile(r"((?:[A-Z_]+=\S+\s+)*sbatch\s(?:[^`]*?--wrap\s+\"[^\"]*\"|"
                         r".*?slurm/[\w./-]+\.(?:slurm|sh)\b[^`#]*))")
# presenting: the instructor talks the prose through at a speaking pace (about 130 words a
# minute) with pauses for the figures, the code on screen and the room's questions
WORDS_PER_MINUTE = 100
# one exercise: read it, write it, run the check, a hint or two, the solution handed out
EXERCISE_MINUTES = 15
KEY = rules.KEY           # cell metadata: {"workshop": {"section": "core" | "optional", "summary": true}}
CORE, OPTIONAL = "core", "optional"
SECTION = re.compile(r"^## (.+)$", re.M)
DAY_START, DAY_END = 9 * 60, 17 * 60
# (clock time, minutes, what): a notebook that would run past a break by at most OVERRUN minutes
# ends first (the break moves); a longer one is split by the break
BREAKS = [(10 * 60 + 30, 15, "coffee"), (12 * 60 + 15, 60, "lunch"), (14 * 60 + 45, 15, "coffee")]
OVERRUN = 15
CLOSING = 30
# the notebooks each course presents, day by day (the rest is self-study)
COURSES = {
    "one day": [["00", "01", "02", "03", "05", "06", "07"]],
    "two days": [["00", "01", "02", "03", "04", "05", "06", "07", "08"], ["09", "10", "11", "12", "13", "15"]],
    "three days": [["00", "01", "02", "03", "04", "05", "06", "07"], ["08", "09", "10", "11", "12", "13"],
                   ["14", "15", "16", "17", "18", "19"]],
}


def sbatch_lines(text: str) -> list[str]:
    """The sbatch lines ``text`` prints (a cell's source, the README), continuation lines joined,
    each with its spaces collapsed and its trailing punctuation left out."""
    return [" ".join(m.group(1).split()).rstrip(" .,;")
            for line in text.replace("\\\n", " ").splitlines() for m in SBATCH_LINE.finditer(line)]


def readme_seconds() -> dict[str, float]:
    """The README's table of notebook times under nbval on quiet cores: {"00": seconds, ...}."""
    readme = NOTEBOOKS.parent / "README.md"
    lines = readme.read_text().splitlines() if readme.is_file() else []
    head = next((ln for ln in lines if ln.startswith("| notebook | 00 ")), None)
    row = next((ln for ln in lines if ln.startswith("| seconds |")), None)
    if head is None or row is None:
        return {}
    cells = lambda ln: [c.strip().rstrip("*") for c in ln.split("|")[2:-1]]  # noqa: E731
    return {n: float(v) for n, v in zip(cells(head), cells(row)) if v.replace(".", "").isdigit()}


def stored_seconds(cell: dict) -> float:
    ex = cell.get("metadata", {}).get("execution", {})
    if "iopub.execute_input" not in ex or "shell.execute_reply" not in ex:
        return 0.0
    t0, t1 = (datetime.fromisoformat(ex[k].rstrip("Z")) for k in ("iopub.execute_input", "shell.execute_reply"))
    return (t1 - t0).total_seconds()


def mark(cell: dict) -> dict:
    return cell.get("metadata", {}).get(KEY, {})


def sections(cells: list[dict], quiet_s: float | None = None) -> list[dict]:
    """The notebook's sections in order, each {title, kind, words, run_s, exercises, minutes}: the
    first is the title and setup (core), then one per `## ` heading (a cell holding several
    headings counts each part to its own section; the cell's mark goes to its first)."""
    stored = sum(stored_seconds(c) for c in cells if c["cell_type"] == "code")
    pace = stored / quiet_s if quiet_s and stored else 1.0   # stored seconds per quiet second
    out = [{"title": "title and setup", "kind": CORE, "words": 0, "run_s": 0.0, "exercises": 0}]
    for cell in cells:
        text = "".join(cell["source"])
        if cell["cell_type"] == "code":
            out[-1]["run_s"] += stored_seconds(cell) / pace
            out[-1]["exercises"] += "TODO" in text
            continue
        if cell["cell_type"] != "markdown" or mark(cell).get("summary"):
            continue
        parts = SECTION.split(text)      # [before, title, body, title, body, ...]
        out[-1]["words"] += len(parts[0].split())
        for j in range(1, len(parts), 2):
            kind = mark(cell).get("section", CORE) if j == 1 else CORE
            out.append({"title": parts[j].strip(), "kind": kind, "words": len(parts[j + 1].split()),
                        "run_s": 0.0, "exercises": 0})
    for s in out:
        s["minutes"] = s["words"] / WORDS_PER_MINUTE + s["run_s"] / 60 + s["exercises"] * EXERCISE_MINUTES
    return out


def slot(minutes: float) -> int:
    """Minutes on the agenda: rounded up to 5."""
    return 5 * math.ceil(minutes / 5 - 1e-9)


def notebooks() -> dict[str, dict]:
    """{number: {title, file, sections, minutes (core, on the agenda), optional (minutes), run_s,
    jobs}} from the files."""
    out, quiet = {}, readme_seconds()
    for path in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        secs = sections(cells, quiet.get(path.name[:2]))
        out[path.name[:2]] = {
            "title": "".join(cells[0]["source"]).splitlines()[0].lstrip("# ").split("·", 1)[-1].strip(),
            "file": path.name, "sections": secs,
            "minutes": slot(sum(s["minutes"] for s in secs if s["kind"] == CORE)),
            "optional": slot(sum(s["minutes"] for s in secs if s["kind"] == OPTIONAL)),
            "run_s": sum(s["run_s"] for s in secs),
            "jobs": any(sbatch_lines("".join(c["source"])) for c in cells)}
    return out


def clock(minutes: int) -> str:
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


def day_agenda(numbers: list[str], nbs: dict) -> tuple[list[str], int]:
    """The rows of one day's table and the teaching minutes it holds; a day that ends after
    DAY_END is refused."""
    rows, now, taught, breaks = [], DAY_START, 0, list(BREAKS)
    for n in numbers:
        left, part = nbs[n]["minutes"], ""
        link = f"[{n} · {nbs[n]['title']}]({nbs[n]['file']})"
        while left:
            at, length, what = breaks[0] if breaks else (DAY_END + 24 * 60, 0, "")
            if now + left <= at + OVERRUN or at - now < 10:
                if at - now < 10 and now + left > at + OVERRUN:   # too little before the break
                    rows.append(f"| {clock(now)} | *{what}* | |")
                    now, breaks = now + length, breaks[1:]
                    continue
                rows.append(f"| {clock(now)} | {link}{part} | {left} min |")
                now, taught, left = now + left, taught + left, 0
                if breaks and now >= at:
                    rows.append(f"| {clock(now)} | *{what}* | |")
                    now, breaks = now + length, breaks[1:]
            else:   # split by the break
                first = at - now
                rows.append(f"| {clock(now)} | {link} (first {first} min) | {first} min |")
                rows.append(f"| {clock(at)} | *{what}* | |")
                now, taught, left, part, breaks = at + length, taught + first, left - first, " (continued)", breaks[1:]
    rows.append(f"| {clock(now)} | *questions, what to read next* | {CLOSING} min |")
    if now + CLOSING > DAY_END:
        raise LaunchError(f"error: the day of {', '.join(numbers)} ends at {clock(now + CLOSING)}, after "
                          f"{clock(DAY_END)}; mark a section optional or move a notebook to another day")
    rows.append(f"| {clock(now + CLOSING)} | *end* | |")
    return rows, taught


def skipped(numbers: list[str], nbs: dict) -> list[str]:
    """The optional sections of a day's notebooks: what the day leaves to self-study."""
    return [f"{n} · {s['title']} ({math.ceil(s['minutes'])} min)"
            for n in numbers for s in nbs[n]["sections"] if s["kind"] == OPTIONAL]


def rates() -> str:
    return (f"prose at {WORDS_PER_MINUTE} words a minute (talked through at a speaking pace, with "
            f"pauses for figures, code and questions), {EXERCISE_MINUTES} minutes for each exercise "
            f"(read, write, check, a hint, the solution handed out) and the cells' run times")


def page() -> str:
    nbs = notebooks()
    out = ["# Course plan", "",
           "Generated by `python -m source_code.course_plan --write` from the notebooks themselves. "
           f"Every section is timed from what it holds: {rates()}, the README's times under nbval "
           "on 2 quiet CPU cores (where it has none, the stored cells' times). Each notebook marks "
           "its sections core or optional; an agenda holds the core sections of its notebooks "
           "(rounded up to 5 minutes) and lists the optional ones it skips: self-study, or the "
           "room's spare time. A day starts at 09:00, with coffee at 10:30 and 14:45 and lunch at "
           "12:15 (a notebook that would overrun a break by at most a quarter of an hour ends "
           "first), and ends by 17:00. What to ask, show and answer in each lesson: "
           "[INSTRUCTOR_NOTES.md](INSTRUCTOR_NOTES.md).", ""]
    for name, days in COURSES.items():
        presented = {n for day in days for n in day}
        out += [f"## {name.capitalize()}", ""]
        for i, day in enumerate(days, 1):
            rows, taught = day_agenda(day, nbs)
            out += [f"**Day {i}** ({taught} minutes of teaching)", "", "| time | notebook | core sections |",
                    "|---|---|---|", *rows, ""]
            skip = skipped(day, nbs)
            out += [f"Day {i} skips (optional sections): " + ("; ".join(skip) if skip else "nothing") + ".", ""]
        rest = [n for n in nbs if n not in presented]
        if rest:
            out += ["Self-study afterwards: " + ", ".join(f"[{n}]({nbs[n]['file']})" for n in rest)
                    + f" ({sum(nbs[n]['minutes'] + nbs[n]['optional'] for n in rest)} minutes "
                    "instructor-led, more on one's own).", ""]
    out += ["## What each notebook needs", "",
            "| notebook | core sections | optional sections | exercises | cells run in (2 CPU cores) "
            "| prints sbatch lines |", "|---|---|---|---|---|---|"]
    for n, nb in nbs.items():
        run = "under 1 min" if nb["run_s"] < 60 else "1-2 min" if nb["run_s"] <= 120 else "over 2 min"
        out.append(f"| [{n}]({nb['file']}) | {nb['minutes']} min | {nb['optional'] or ''}{' min' if nb['optional'] else ''} "
                   f"| {sum(s['exercises'] for s in nb['sections'])} | {run} | {'yes' if nb['jobs'] else ''} |")
    core, extra = sum(nb["minutes"] for nb in nbs.values()), sum(nb["optional"] for nb in nbs.values())
    out += ["", f"All {len(nbs)} notebooks: {core} minutes of core sections ({core / 60:.1f} hours), "
            f"{extra} more for the optional ones.", "",
            "No notebook needs a GPU: every cell runs on a laptop's CPU cores, and the same cells use "
            "the GPUs of a GPU node (`make gpu-smoke` checks those paths there). The sbatch lines "
            "the notebooks print are for the cluster: participants submit them from a terminal "
            "there (a login node's, or their lab's on its compute node), in the clone, with the "
            "course's Python (the site's PyTorch module or container at CSC and LUMI, never a "
            "`.venv` there; the clone's `.venv` on JURECA); the notebooks themselves run on a "
            "compute node or a laptop, never on a login node "
            "([LAB_ON_A_CLUSTER.md](LAB_ON_A_CLUSTER.md)). When the course's queue is "
            "slow, move to the site's test partition ([SLOW_QUEUE.md](SLOW_QUEUE.md)), submit "
            "them to the local two-node cluster instead (`make cluster-up` on a machine where you "
            "are root: the same sbatch lines run there), or show the stored outputs: every "
            "notebook is stored executed, with its outputs and figures. What to cut when the room "
            "is behind, the helpers' roles and a feedback form: [COURSE_DAY.md](COURSE_DAY.md).", "",
            "## Every section, timed", "",
            "| notebook | section | kind | words | exercises | cells run (s) | minutes |", "|---|---|---|---|---|---|---|"]
    for n, nb in nbs.items():
        for s in nb["sections"]:
            out.append(f"| {n} | {s['title'].replace('|', '/')} | {s['kind']} | {s['words']} | "
                       f"{s['exercises'] or ''} | {s['run_s']:.0f} | {s['minutes']:.1f} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> None:
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true", help=f"write {PAGE.relative_to(NOTEBOOKS.parent)}")
    args = p.parse_args(argv)
    text = page()
    if args.write:
        PAGE.write_text(text)
        print(f"wrote {PAGE}")
    else:
        print(text, end="")


if __name__ == "__main__":
    run_main(main)
