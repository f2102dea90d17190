"""What `make prepare` and `make check` run with on a site's login node: a Python that has torch.

    python -m source_code.launch.login_node                 # every current site
    python -m source_code.launch.login_node --site lumi

`make prepare` imports torch (source_code/data.py), and a login node's own Python has none:
LUMI's `cray-python` and JURECA's Stage Python are enough for the site step (Python's own
library only), not for make. Per site, what works, read from its profile (slurm/sites/*.sh):

* a PyTorch module in the profile's site_environment (Roihu): load it, then PYTHON=python3;
* a container image the profile runs every launch in (LUMI: LUMI_SIF, default LUMI_SIF_DEFAULT):
  with the profile's bindings module (the file systems inside the image), make prepare's
  Python is the image's, `singularity exec --bind $PWD $LUMI_SIF python3`, which
  also runs make check's rows (`-m source_code.readiness`);
* the Stage's Python and the clone's own venv (JURECA: the Stage's PyTorch is too old): the
  venv activated, make's default Python.
"""
from __future__ import annotations

import argparse
import re
import sys

from source_code.launch.site_profiles import SITES_DIR, ProfileError, current_sites, load

DATA = "$WORKSHOP_DATA"   # exported before: the course's one copy, in the project's scratch


def image_default(key: str) -> tuple[str, str] | None:
    """(variable, default image) of a profile that runs every launch in a container, else None."""
    m = re.search(r"^(\w+_SIF)_DEFAULT=(\S+)", (SITES_DIR / f"{key}.sh").read_text(), re.M)
    return (m.group(1), m.group(2)) if m else None


def make_lines(key: str, data: str = DATA) -> list[str]:
    """The lines a participant types on ``key``'s login node, from the clone's root, for make."""
    site = load(key)
    modules = [ln for ln in site.environment.splitlines() if ln.startswith("module load")]
    image = image_default(key)
    if image:
        var, path = image
        bindings = [ln for ln in site.environment.splitlines() if ln.startswith(("module use", "module load"))]
        first = bindings + [f"# the profile's image (ls {path.rsplit('/', 2)[0]}/ lists the others)",
                            f"export {var}={path}"]
        python = f"singularity exec --bind $PWD ${var} python3"
        # make check puts the folder of a PYTHON with a / first on PATH: the image's python runs
        # the readiness rows directly instead
        return first + [f'PYTHON="{python}" make prepare DATA={data}',
                        f"{python} -m source_code.readiness --datasets mnist"]
    torch_module = [ln for ln in modules if "pytorch" in ln.lower()]
    if torch_module:
        line = re.sub(r'"\$\{\w+:-([^}]+)\}"', r"\1", torch_module[0])    # the module's default name
        return [line, f"make prepare PYTHON=python3 DATA={data}", 'make check PYTHON=python3 ARGS="--datasets mnist"']
    if modules and "venv" in site.environment.lower():
        line = re.sub(r'"\$\{\w+:-([^}]+)\}"', r"\1", modules[0])
        line = re.sub(r'"?Stages/\$\{STAGE:-(\w+)\}"?', r"Stages/\1", line)
        return [line, "source .venv/bin/activate   # the clone's venv, built once with this Python (make venv)",
                f"make prepare DATA={data}", 'make check ARGS="--datasets mnist"']
    raise ProfileError(f"error: the profile of {site.name} names no PyTorch module, image or venv for make")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--site", default=None, help="one site (default: every current one)")
    p.add_argument("--data", default=DATA, help="the course's data directory")
    a = p.parse_args(argv)
    try:
        for key in [a.site] if a.site else current_sites():
            print(f"# {load(key).name}\n" + "\n".join(make_lines(key, a.data)))
    except ProfileError as err:
        print(err.message, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
