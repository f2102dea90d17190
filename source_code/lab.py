"""JupyterLab for the workshop: the repository is the lab's root, and it opens on a start page.

    make lab                           # prints the URL to open, then serves until Ctrl-C
    LAB_PORT=8890 make lab             # another port
    python -m source_code.lab --port 8890

The lab opens on notebooks/START_HERE.md (rendered: the notebooks in order, where the learner's
own copies go), with the file browser in notebooks/. Its settings (source_code/lab_settings/)
ask no question about Jupyter news, show Markdown files rendered and give the file browser's
width to the names (no Modified column). From the file browser a learner reaches everything the notebooks send them
to (`source_code/solutions/`, `source_code/training/ddp.py`, `slurm/`), and a lab terminal
starts in the repository, where the printed `sbatch slurm/...` commands work. A busy port is
said in one line before anything is printed to open.
"""
from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

from source_code.cli import Parser
from source_code.errors import LaunchError, run_main
from source_code.rendezvous import free_port, port_is_free

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = Path(__file__).resolve().parent / "lab_settings"   # read only: overrides.json
START_PAGE = "notebooks/START_HERE.md"


def command(port: int, token: str, root: Path = ROOT) -> list[str]:
    """The jupyter lab command line (the tests start the server with this very command)."""
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
           f"--ServerApp.root_dir={root}", f"--LabApp.default_url=/lab/tree/{START_PAGE}",
           f"--LabApp.app_settings_dir={SETTINGS}",
           # RISE's presenter reads its own settings folder: the same overrides (a theme that
           # asks no web fonts of the network)
           f"--RiseApp.app_settings_dir={SETTINGS}"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    return cmd


def main(argv=None) -> int:
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=int(os.environ.get("LAB_PORT") or 8888))
    args = p.parse_args(argv)
    if not port_is_free(args.port, "127.0.0.1"):
        raise LaunchError(f"error: port {args.port} is busy (another JupyterLab?); "
                          f"use another: LAB_PORT={free_port()} make lab")
    token = secrets.token_hex(16)
    print(f"JupyterLab: open http://127.0.0.1:{args.port}/lab/tree/{START_PAGE}?token={token}", flush=True)
    os.execv(sys.executable, command(args.port, token))


if __name__ == "__main__":
    run_main(main)
