"""JupyterLab for self-paced learners: the real server, started from this environment.

Starts `python -m jupyterlab` on a free port with a random token, checks that its contents
API lists every numbered notebook, runs one cell of notebook 06 through a kernel the
server starts (REST + websocket channels, as the browser does), and shuts everything down.
"""
from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

import pytest
import requests
import websocket  # websocket-client, a dependency of jupyter_server

from source_code.lab import command as lab_command

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
START_TIMEOUT_S = 60
CELL_TIMEOUT_S = 30
# the notebook cell the test runs: it prints Slurm headers and needs no torch import
CELL_NOTEBOOK = "06_launching.ipynb"
CELL_MARKER = "site_profiles.header("
CELL_SETUP = "from source_code.launch import site_profiles"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _log_tail(path: Path, n: int = 4000) -> str:
    return path.read_text(errors="replace")[-n:] if path.exists() else "(no log)"


@pytest.fixture
def lab(tmp_path):
    """A running JupyterLab server: yields (base_url, token, headers); always stopped after."""
    port, token = _free_port(), secrets.token_hex(16)
    log = tmp_path / "jupyterlab.log"
    cmd = lab_command(port, token)  # what `make lab` runs: the repository as the lab's root
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    base = f"http://127.0.0.1:{port}"
    headers = {"Authorization": f"token {token}"}
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"jupyter lab exited with code {proc.returncode} before answering; "
                            f"its log:\n{_log_tail(log)}")
            try:
                if requests.get(f"{base}/api/status", headers=headers, timeout=2).ok:
                    break
            except requests.ConnectionError:
                pass
            except requests.Timeout:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"jupyter lab did not answer on {base} within {START_TIMEOUT_S} s; "
                            f"its log:\n{_log_tail(log)}")
            time.sleep(0.25)
        yield base, token, headers
    finally:
        # ask the server to stop (it shuts its kernels down), then make sure of it
        try:
            requests.post(f"{base}/api/shutdown", headers=headers, timeout=5)
        except requests.RequestException:
            pass
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        # any kernel left in the server's session (its own process group) goes with it
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _notebook_cell(name: str, marker: str) -> str:
    nb = json.loads((NOTEBOOKS / name).read_text())
    for cell in nb["cells"]:
        src = "".join(cell["source"])
        if cell["cell_type"] == "code" and marker in src:
            return src
    pytest.fail(f"no code cell containing {marker!r} in notebooks/{name}")


def _execute(ws, code: str, timeout: float = CELL_TIMEOUT_S) -> tuple[dict, str]:
    """Run `code` on the kernel behind websocket `ws`: (execute_reply content, stdout text)."""
    msg_id = uuid.uuid4().hex
    ws.send(json.dumps({
        "channel": "shell",
        "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "test",
                   "session": uuid.uuid4().hex, "version": "5.3",
                   "date": datetime.now(timezone.utc).isoformat()},
        "parent_header": {}, "metadata": {}, "buffers": [],
        "content": {"code": code, "silent": False, "store_history": False,
                    "user_expressions": {}, "allow_stdin": False, "stop_on_error": True},
    }))
    reply, stdout, idle, errors = None, [], False, []
    deadline = time.monotonic() + timeout
    while reply is None or not idle:
        left = deadline - time.monotonic()
        if left <= 0:
            pytest.fail(f"cell did not finish within {timeout} s; stdout so far:\n{''.join(stdout)}")
        ws.settimeout(left)
        msg = json.loads(ws.recv())
        if msg.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "execute_reply":
            reply = content
        elif kind == "stream" and content["name"] == "stdout":
            stdout.append(content["text"])
        elif kind == "error":
            errors.append("\n".join(content["traceback"]))
        elif kind == "status" and content["execution_state"] == "idle":
            idle = True
    assert reply["status"] == "ok", f"cell failed:\n{code}\n" + "\n".join(errors)
    return reply, "".join(stdout)


def test_jupyterlab_lists_notebooks_and_runs_a_cell(lab):
    base, _, headers = lab

    # the learner sees every numbered notebook in the file browser
    listing = requests.get(f"{base}/api/contents/notebooks", headers=headers, timeout=10)
    assert listing.ok, listing.text
    listed = {item["name"] for item in listing.json()["content"] if item["type"] == "notebook"}
    # ... and, from the same root, the files the notebooks send them to
    for path in ("source_code/solutions", "source_code/training/ddp.py", "slurm/ddp_multinode.slurm"):
        assert requests.get(f"{base}/api/contents/{path}", headers=headers, timeout=10).ok, path
    on_disk = {p.name for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")}
    assert on_disk, "no notebooks found in notebooks/"
    assert on_disk <= listed, f"not listed by the server: {sorted(on_disk - listed)}"
    # the page itself is served
    assert requests.get(f"{base}/lab", headers=headers, timeout=10).ok

    # a kernel started by the server, driven over its websocket channels
    started = requests.post(f"{base}/api/kernels", headers=headers,
                            json={"name": "python3"}, timeout=30)
    assert started.ok, started.text
    kernel_id = started.json()["id"]
    ws = None
    try:
        ws = websocket.create_connection(
            f"ws://{base.removeprefix('http://')}/api/kernels/{kernel_id}/channels",
            header=[f"Authorization: {headers['Authorization']}"], timeout=CELL_TIMEOUT_S)

        # the kernel is this project's environment
        _, out = _execute(ws, "import sys; print(sys.prefix)")
        assert out.strip() == sys.prefix

        # one real cell of notebook 06, after the import it needs from the notebook's first cell
        cell = _notebook_cell(CELL_NOTEBOOK, CELL_MARKER)
        _execute(ws, CELL_SETUP)
        _, out = _execute(ws, cell)
        assert "#SBATCH --nodes=" in out, out
        assert "WORKSHOP_SITE=lumi" in out and "WORKSHOP_SITE=puhti" in out, out
    finally:
        if ws is not None:
            ws.close()
        requests.delete(f"{base}/api/kernels/{kernel_id}", headers=headers, timeout=30)
