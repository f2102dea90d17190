"""JupyterLab for the workshop: the repository is the lab's root, and it opens on a start page.

    make lab                           # prints the URL to open, then serves until Ctrl-C
    LAB_PORT=8890 make lab             # another port
    python -m source_code.lab --port 8890

The lab opens on notebooks/START_HERE.md (rendered: the notebooks in order, where the learner's
own copies go), with the file browser in notebooks/. Its settings (source_code/lab_settings/)
ask no question about Jupyter news, show Markdown files rendered and give the file browser's
width to the names (no Modified column); its first layout gives the file browser room for the
longest notebook name (a workspace in .lab-workspaces/, which the lab then keeps up to date). From the file browser a learner reaches everything the notebooks send them
to (`source_code/solutions/`, `source_code/training/ddp.py`, `slurm/`), and a lab terminal
starts in the repository, where the printed `sbatch slurm/...` commands work. A busy port is
said in one line before anything is printed to open.
"""
from __future__ import annotations

import json
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


# The lab's first layout: the file browser open and wide enough for the notebooks' names (the
# lab's own default gives it about a fifth of the window and cuts the longer names short). A
# workspace holds it; the lab keeps a learner's later changes there.
FIRST_LAYOUT = {
    "left": {"collapsed": False, "visible": True, "current": "filebrowser"},
    "right": {"collapsed": True, "visible": True},
    "relativeSizes": [0.3, 0.7, 0.0],     # file browser, documents, right side bar
}


def workspaces_dir(root: Path = ROOT) -> Path:
    """Where the lab keeps its layout: JUPYTERLAB_WORKSPACES_DIR, else .lab-workspaces/ in the
    repository (git ignores it)."""
    return Path(os.environ.get("JUPYTERLAB_WORKSPACES_DIR") or root / ".lab-workspaces")


def seed_first_layout(folder: Path) -> None:
    """Write the default workspace with FIRST_LAYOUT, unless the lab has written one already."""
    from jupyterlab_server.workspaces_handler import WorkspacesManager
    manager = WorkspacesManager(str(folder))
    if manager.load("default").get("data"):
        return                                  # a learner's own layout: kept
    manager.save("default", json.dumps({"data": {"layout-restorer:data": FIRST_LAYOUT},
                                        "metadata": {"id": "default"}}))


def command(port: int, token: str, root: Path = ROOT) -> list[str]:
    """The jupyter lab command line (the tests start the server with this very command); the
    workspace folder it names gets the first layout if it has none."""
    spaces = workspaces_dir(root)
    seed_first_layout(spaces)
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
           f"--ServerApp.root_dir={root}", f"--LabApp.default_url=/lab/tree/{START_PAGE}",
           f"--LabApp.app_settings_dir={SETTINGS}", f"--LabApp.workspaces_dir={spaces}",
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
