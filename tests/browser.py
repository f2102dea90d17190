"""A real browser for the tests: Debian's chromium and chromedriver, driven headless by selenium.

`driver(width, height)` returns a webdriver; chromium is installed with apt-get when it is
missing and this is root (as tests/slurm_cluster.py installs Slurm). `why_not_possible()` says
why there can be no browser here (for a skip), or None.
"""
from __future__ import annotations

import os
import shutil
import subprocess

PACKAGES = ["chromium", "chromium-driver"]
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


def why_not_possible() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (requirements.txt)"
    if os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER):
        return None
    if os.name != "posix" or os.geteuid() != 0 or not shutil.which("apt-get"):
        return f"chromium is not installed and cannot be installed here: apt-get install {' '.join(PACKAGES)}"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True)
    res = subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES],
                         env=env, capture_output=True, text=True)
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        return f"apt-get install {' '.join(PACKAGES)} failed: {res.stderr.strip()[-300:]}"
    return None


def driver(width: int = 1400, height: int = 900):
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    options = Options()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", f"--window-size={width},{height}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
