"""The slides' command line (see __init__.py):  python -m source_code.slides --mark|--check|--export DIR"""
from __future__ import annotations

from pathlib import Path

from source_code.cli import Parser, writable_path
from source_code.errors import LaunchError, run_main
from source_code.slides import export, rules

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"


def numbered() -> list[Path]:
    return sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def notebooks(names: list[str]) -> list[Path]:
    """The notebooks named (all numbered ones when none is), each checked to exist."""
    if not names:
        return numbered()
    paths = [Path(n) for n in names]
    bad = [str(p) for p in paths if p.suffix != ".ipynb" or not p.is_file()]
    if bad:
        raise LaunchError(f"error: not a notebook file: {', '.join(bad)} (name notebooks/NN_name.ipynb, or none for all)")
    return paths


def stale(paths: list[Path]) -> list[str]:
    """One line per notebook whose stored slide types the rule would change."""
    lines = []
    for path in paths:
        cells = rules.stale_cells(rules.read(path))
        if cells:
            shown = ", ".join(map(str, cells[:8])) + (" ..." if len(cells) > 8 else "")
            lines.append(f"{path.name}: slide types missing or stale in cells {shown}")
    return lines


def too_tall(paths: list[Path]) -> list[str]:
    """One line per notebook with a screen taller than the slide, by the rule's estimate."""
    lines = []
    for path in paths:
        over = rules.overflowing(rules.read(path)["cells"])
        if over:
            shown = ", ".join(f"{i} ({h})" for i, h in over[:8]) + (" ..." if len(over) > 8 else "")
            lines.append(f"{path.name}: screens over {rules.SCREEN_LINES} lines at cells (lines) {shown}")
    return lines


def _named(paths: list[Path], problems: list[str]) -> str:
    return " ".join(str(p.relative_to(ROOT)) if p.is_absolute() and p.is_relative_to(ROOT) else str(p)
                    for p in paths if any(line.startswith(p.name + ":") for line in problems))


def main(argv=None) -> int:
    p = Parser(prog="python -m source_code.slides", description=__doc__.splitlines()[0])
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--mark", action="store_true", help="write the rule's slide type into every cell")
    what.add_argument("--check", action="store_true",
                      help="exit 1 naming notebooks whose slide types are stale or whose screens overflow")
    what.add_argument("--export", metavar="DIR", type=writable_path, help="write one HTML deck per notebook into DIR")
    p.add_argument("notebooks", nargs="*", help="notebook files (default: every numbered notebook)")
    args = p.parse_args(argv)
    paths = notebooks(args.notebooks)
    if args.mark:
        for path in paths:
            print(f"{path.name}: {rules.mark(path)} cells changed, "
                  "%d slides + %d subslides" % rules.counts(rules.stored_types(rules.read(path)["cells"])))
        return 0
    problems = stale(paths)
    if args.check:
        tall = too_tall(paths)
        for line in problems + tall:
            print(line)
        only_stale = [line for line in problems if not any(t.split(":")[0] == line.split(":")[0] for t in tall)]
        if only_stale:
            print("fix: python -m source_code.slides --mark " + _named(paths, only_stale))
        if tall:
            print("fix: python -m source_code.slides.fit " + _named(paths, tall))
        if problems or tall:
            return 1
        print(f"slide types up to date and every screen within {rules.SCREEN_LINES} lines in {len(paths)} notebooks")
        return 0
    if problems:
        raise LaunchError(f"error: {problems[0]}; first run: python -m source_code.slides --mark")
    for deck, slides, subslides in export.export(paths, Path(args.export)):
        print(f"{deck}: {slides} slides, {slides + subslides} screens", flush=True)
    return 0


if __name__ == "__main__":
    run_main(main)
