"""The course plan: one-, two- and three-day agendas built from what the notebooks state.

    python -m source_code.course_plan                 # print the plan (Markdown)
    python -m source_code.course_plan --write         # rewrite notebooks/COURSE_PLAN.md

Each notebook's first cell states its instructor-led time (exercises included) and the stored
notebook records how long its cells took to run; the plan reads both from the files, so it
changes when they do (tests/test_course_plan.py fails until the page is rewritten). A day
starts at 09:00 and places the notebooks in teaching order, with coffee at 10:30 and 14:45 and
lunch at 12:15: a notebook that would run past a break by at most a quarter of an hour ends
first (the break moves), a longer one is split by it; a closing half hour ends the day.
"""
from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path

from source_code.cli import Parser
from source_code.errors import LaunchError, run_main

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
PAGE = NOTEBOOKS / "COURSE_PLAN.md"
# an `sbatch ...` line as printed in a notebook or the README: the job script's path or a --wrap
# command, with the variables set before it (tests/test_sbatch_lines.py submits what it matches)
SBATCH_LINE = re.compile(r"((?:[A-Z_]+=\S+\s+)*sbatch\s(?:[^`]*?--wrap\s+\"[^\"]*\"|"
                         r".*?slurm/[\w./-]+\.(?:slurm|sh)\b[^`#]*))")
TIME = re.compile(r"about (\d+) min(?:utes)? (?:in an )?instructor-led|instructor-led about (\d+) min")
DAY_START, DAY_END = 9 * 60, 17 * 60
# (clock time, minutes, what): a notebook that would run past a break by at most OVERRUN minutes
# ends first (the break moves); a longer one is split by the break
BREAKS = [(10 * 60 + 30, 15, "coffee"), (12 * 60 + 15, 60, "lunch"), (14 * 60 + 45, 15, "coffee")]
OVERRUN = 15
CLOSING = 30
# the notebooks each course presents, day by day (the rest is self-study)
COURSES = {
    "one day": [["00", "01", "02", "03", "05", "06", "07"]],
    "two days": [["00", "01", "02", "03", "04", "05", "06", "07"], ["08", "09", "10", "11", "12", "13", "15"]],
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


def notebooks() -> dict[str, dict]:
    """{number: {title, file, minutes (instructor-led), run_s, jobs}} from the files; run_s from the
    README's table of times on quiet cores, else the sum of the stored cells' times."""
    out, quiet = {}, readme_seconds()
    for path in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        head = "\n".join("".join(c["source"]) for c in cells[:2])
        m = TIME.search(head)
        if not m:
            raise LaunchError(f"error: {path.name} states no instructor-led time in its first cells; "
                              f"add 'about N minutes instructor-led'")
        run_s = quiet.get(path.name[:2], 0.0)  # the README's measurement on quiet cores, when it has one:
        for c in cells if not run_s else ():   # stored cells' times depend on the machine that stored them
            ex = c.get("metadata", {}).get("execution", {})
            if "iopub.execute_input" in ex and "shell.execute_reply" in ex:
                t0, t1 = (datetime.fromisoformat(ex[k].rstrip("Z")) for k in ("iopub.execute_input", "shell.execute_reply"))
                run_s += (t1 - t0).total_seconds()
        out[path.name[:2]] = {
            "title": "".join(cells[0]["source"]).splitlines()[0].lstrip("# ").split("·", 1)[-1].strip(),
            "file": path.name, "minutes": int(m.group(1) or m.group(2)), "run_s": run_s,
            "jobs": any(sbatch_lines("".join(c["source"])) for c in cells)}
    return out


def clock(minutes: int) -> str:
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


def day_agenda(numbers: list[str], nbs: dict) -> tuple[list[str], int]:
    """The rows of one day's table and the teaching minutes it holds."""
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
    if now + CLOSING > DAY_END + OVERRUN:
        raise LaunchError(f"error: the day of {', '.join(numbers)} ends at {clock(now + CLOSING)}; "
                          f"move a notebook to another day")
    rows.append(f"| {clock(now + CLOSING)} | *end* | |")
    return rows, taught


def page() -> str:
    nbs = notebooks()
    out = ["# Course plan", "",
           "Generated by `python -m source_code.course_plan --write` from the notebooks themselves: the "
           "minutes are the instructor-led times each notebook states in its first cell (its "
           "exercises included: they are estimates, from teaching the material), the run times are "
           "the README's, measured under nbval on 2 quiet CPU cores (where it has none, the stored "
           "cells' times), in bins (running them live costs "
           "a minute or two of each slot). A day starts at 09:00, with coffee at "
           "10:30 and 14:45 and lunch at 12:15 (a notebook that would overrun a break by at most a "
           "quarter of an hour ends first). What to ask, show and answer in each lesson: "
           "[INSTRUCTOR_NOTES.md](INSTRUCTOR_NOTES.md).", ""]
    for name, days in COURSES.items():
        presented = {n for day in days for n in day}
        out += [f"## {name.capitalize()}", ""]
        for i, day in enumerate(days, 1):
            rows, taught = day_agenda(day, nbs)
            out += [f"**Day {i}** ({taught} minutes of teaching)", "", "| time | notebook | instructor-led |",
                    "|---|---|---|", *rows, ""]
        rest = [n for n in nbs if n not in presented]
        if rest:
            out += ["Self-study afterwards: " + ", ".join(f"[{n}]({nbs[n]['file']})" for n in rest)
                    + f" ({sum(nbs[n]['minutes'] for n in rest)} minutes instructor-led, more on one's own).", ""]
    out += ["## What each notebook needs", "",
            "| notebook | instructor-led | cells run in (2 CPU cores) | prints sbatch lines |", "|---|---|---|---|"]
    for n, nb in nbs.items():
        run = "under 1 min" if nb["run_s"] < 60 else "1-2 min" if nb["run_s"] <= 120 else "over 2 min"
        out.append(f"| [{n}]({nb['file']}) | {nb['minutes']} min | {run} | {'yes' if nb['jobs'] else ''} |")
    total = sum(nb["minutes"] for nb in nbs.values())
    out += ["", f"All {len(nbs)} notebooks: {total} minutes instructor-led ({total / 60:.1f} hours).", "",
            "No notebook needs a GPU: every cell runs on a laptop's CPU cores, and the same cells use "
            "the GPUs of a GPU node (`make gpu-smoke` checks those paths there). The sbatch lines "
            "the notebooks print are for the cluster: participants submit them from a login node, "
            "where the repository and its `.venv` (or the site's PyTorch module with "
            "`PYTHON=python3`) are; the notebooks themselves run on a compute node, never on a "
            "login node ([LAB_ON_A_CLUSTER.md](LAB_ON_A_CLUSTER.md)). When the course's queue is "
            "slow, move to the site's test partition ([SLOW_QUEUE.md](SLOW_QUEUE.md)), submit "
            "them to the local two-node cluster instead (`make cluster-up` on a machine where you "
            "are root: the same sbatch lines run there), or show the stored outputs: every "
            "notebook is stored executed, with its outputs and figures. What to cut when the room "
            "is behind, the helpers' roles and a feedback form: [COURSE_DAY.md](COURSE_DAY.md).", ""]
    return "\n".join(out)


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
