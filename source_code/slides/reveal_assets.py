"""reveal.js for the static decks, from the jupyterlab-rise package (no network, no second copy).

jupyterlab-rise (requirements.txt) presents the notebooks live in JupyterLab with reveal.js, and
its wheel carries the files it was built from in its source maps: reveal.js's `dist/reveal.esm.js`
and its style sheets, verbatim. `write(folder)` writes them as `dist/reveal.js` (a classic script
that sets `window.Reveal`: a module cannot load from a file:// page), `dist/reveal.css` and
`dist/theme/white.css`, so the exported decks show the same reveal.js as the live slideshow.
The theme's web-font import is left out (the fonts' files are not among the sources): the
browser's sans-serif takes their place.
"""
from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

from source_code.errors import LaunchError

INSTALL = "pip install -r requirements.txt (it brings jupyterlab-rise)"
# what the decks load, and where in the reveal.js package it comes from
WANTED = {
    "dist/reveal.js": "node_modules/reveal.js/dist/reveal.esm.js",
    "dist/reveal.css": "node_modules/reveal.js/dist/reveal.css",
    "dist/theme/white.css": "node_modules/reveal.js/dist/theme/white.css",
    "plugin/notes/notes.js": "node_modules/reveal.js/plugin/notes/notes.esm.js",
}


def rise_static() -> Path:
    spec = importlib.util.find_spec("jupyterlab_rise")
    if spec is None or not spec.submodule_search_locations:
        raise LaunchError(f"error: jupyterlab-rise is not installed, and the decks take reveal.js from it: {INSTALL}")
    return Path(next(iter(spec.submodule_search_locations))) / "static"


def _original_css(module_source: str) -> str:
    """A style sheet as css-loader wrapped it: the original is the first source of the source
    map that the wrapper embeds."""
    start = module_source.index('{"version":3')
    inner, _ = json.JSONDecoder().raw_decode(module_source, start)
    return inner["sourcesContent"][0]


def _classic_script(esm: str) -> str:
    """reveal.esm.js ends with `export default W;` and imports nothing: the same code as a
    classic script that sets window.Reveal."""
    body, n = re.subn(r"export default (\w+);", r"window.Reveal = \1;", esm)
    if n != 1 or re.search(r"^\s*(import|export)\b", body, re.M):
        raise LaunchError("error: this jupyterlab-rise's reveal.js is not the single-export module "
                          f"the decks expect; install the version in requirements.txt: {INSTALL}")
    body = re.sub(r"//# sourceMappingURL=\S+\s*$", "", body)
    return "(function () {\n" + body + "\n})();\n"


def _classic_plugin(esm: str, name: str) -> str:
    """A plugin module (`export default () => {...}`, no import) as a classic script that sets
    window.<name>: the speaker view (press S) opens a window of its own, nothing fetched."""
    body, n = re.subn(r"export default\s*", f"window.{name} = ", esm, count=1)
    if n != 1 or re.search(r"^\s*(import|export)\b", body, re.M):
        raise LaunchError(f"error: this jupyterlab-rise's reveal.js notes plugin is not the module the decks "
                          f"expect; install the version in requirements.txt: {INSTALL}")
    body = re.sub(r"//# sourceMappingURL=\S+\s*$", "", body)
    return "(function () {\n" + body + "\n})();\n"


def sources() -> dict[str, str]:
    """{file the decks load: its text}, read from jupyterlab-rise's source maps."""
    found: dict[str, str] = {}
    wanted = {origin: name for name, origin in WANTED.items()}
    for path in sorted(rise_static().glob("*.js.map")):
        raw = path.read_bytes()
        if b"node_modules/reveal.js/" not in raw:
            continue
        smap = json.loads(raw)
        for src, text in zip(smap.get("sources", []), smap.get("sourcesContent") or []):
            origin = next((o for o in wanted if src.endswith(o)), None)
            if origin and text and wanted[origin] not in found:
                found[wanted[origin]] = text
        if len(found) == len(WANTED):
            break
    missing = sorted(set(WANTED) - set(found))
    if missing:
        raise LaunchError(f"error: jupyterlab-rise's files lack reveal.js's {', '.join(missing)}; "
                          f"install the version in requirements.txt: {INSTALL}")
    out = {"dist/reveal.js": _classic_script(found["dist/reveal.js"]),
           "plugin/notes/notes.js": _classic_plugin(found["plugin/notes/notes.js"], "RevealNotes")}
    for name in ("dist/reveal.css", "dist/theme/white.css"):
        css = _original_css(found[name])
        out[name] = re.sub(r"@import url\(\./fonts/[^)]*\);\s*", "", css)
    return out


def version(script: str) -> str:
    m = re.search(r"reveal\.js (\d+\.\d+\.\d+)", script)
    return m[1] if m else "unknown"


def write(folder: Path) -> str:
    """Write reveal.js into `folder` (dist/...); returns reveal.js's version."""
    files = sources()
    for name, text in files.items():
        target = Path(folder) / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    return version(files["dist/reveal.js"])
