"""The make lines of a site's login node use a Python that has torch: never the site's bare
python3 where the profile runs in a container (LUMI) or needs the clone's venv (JURECA)."""
from __future__ import annotations

import re
import subprocess
import sys

from source_code.launch import login_node
from source_code.launch.site_profiles import SITES_DIR, current_sites, load


def test_lumi_runs_make_prepare_in_the_profiles_image_with_its_bindings():
    lines = login_node.make_lines("lumi")
    default = re.search(r"^LUMI_SIF_DEFAULT=(\S+)", (SITES_DIR / "lumi.sh").read_text(), re.M)[1]
    assert f"export LUMI_SIF={default}" in lines
    assert "module load lumi-aif-singularity-bindings" in lines
    prepare = next(ln for ln in lines if "make prepare" in ln)
    assert prepare.startswith('PYTHON="singularity exec --bind $PWD $LUMI_SIF python3"')
    # LUMI_SIF is exported before any line uses it; no make line runs the login node's python3
    assert lines.index(f"export LUMI_SIF={default}") < lines.index(prepare)
    assert not any(re.search(r"PYTHON=python3\b", ln) for ln in lines)


def test_roihu_loads_its_pytorch_module_and_jureca_activates_the_venv_first():
    roihu = login_node.make_lines("roihu")
    assert roihu[0] == "module load python-pytorch" and "PYTHON=python3" in roihu[1]
    assert "python-pytorch" in load("roihu").environment
    jureca = login_node.make_lines("jureca")
    assert jureca[0].startswith("module load Stages/") and "$" not in jureca[0]
    assert jureca[1].startswith("source .venv/bin/activate") and "PYTHON=" not in " ".join(jureca)


def test_every_current_site_has_lines_and_the_command_line_prints_them():
    done = subprocess.run([sys.executable, "-m", "source_code.launch.login_node"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    for key in current_sites():
        assert f"# {load(key).name}" in done.stdout and login_node.make_lines(key)
