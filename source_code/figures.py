"""Exporting the notebooks' figures to images/: on purpose only, never as a side effect.

The notebooks show every figure inline; ``export`` also writes it to ``images/`` when
WORKSHOP_EXPORT_FIGURES=1, so running the notebooks under the tests leaves tracked files as
they are. ``make figures`` re-executes the notebooks with the variable set: images/ then
holds exactly what the stored notebooks show.
"""
from __future__ import annotations

import os
from pathlib import Path

IMAGES = Path(__file__).resolve().parents[1] / "images"


def exporting() -> bool:
    return os.environ.get("WORKSHOP_EXPORT_FIGURES", "") == "1"


def export(fig, name, dpi: int = 120) -> Path | None:
    """Save ``fig`` as images/NAME (or at the path NAME) when exporting; return where, or None."""
    if not exporting() or name is None:
        return None
    path = Path(name)
    path = path if path.parent != Path(".") else IMAGES / path
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    return path
