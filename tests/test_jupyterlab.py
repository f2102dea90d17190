"""JupyterLab for self-paced learners: the real server, started from this environment.

Starts `python -m jupyterlab` on a free port with a random token, checks that its contents
API lists every numbered notebook, runs one cell of notebook 06 through a kernel the
server starts (REST + websocket channels, as the browser does), and shuts everything down.
A real browser (tests/browser.py) opens what `make lab` prints: the start page rendered, no
pop-up, the notebooks' names in the file browser, none cut short, and a notebook opened from the start page's
link starts its kernel without being marked modified (else autosave rewrites the tracked file).
"""
from __future__ import annotations

import json
import os
import re
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

from source_code.lab import START_PAGE, command as lab_command

sys.path.insert(0, str(Path(__file__).parent))
import browser  # noqa: E402

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
def lab(tmp_path, monkeypatch):
    """A running JupyterLab server: yields (base_url, token, headers); always stopped after."""
    port, token = _free_port(), secrets.token_hex(16)
    log = tmp_path / "jupyterlab.log"
    # a fresh learner: no workspace of an earlier lab (the command seeds the first layout there)
    monkeypatch.setenv("JUPYTERLAB_WORKSPACES_DIR", str(tmp_path / "workspaces"))
    cmd = lab_command(port, token)  # what `make lab` runs: the repository as the lab's root
    assert f"--LabApp.workspaces_dir={tmp_path / 'workspaces'}" in cmd, cmd
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
           # a fresh learner: no settings of an earlier lab
           "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "user-settings"),
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
        sites = set(re.findall(r"WORKSHOP_SITE=(\w+)", out))   # the cell's headers, one per site it shows
        assert "lumi" in sites and len(sites) >= 2, out
    finally:
        if ws is not None:
            ws.close()
        requests.delete(f"{base}/api/kernels/{kernel_id}", headers=headers, timeout=30)


# ------------------------------------------------------------------ the first screen, in a browser
OPENED_NOTEBOOK = "05_ddp.ipynb"
LINK_TEXT = "05 · DistributedDataParallel (DDP)"


def _wait(d, what: str, condition, timeout: float = 60):
    from selenium.webdriver.support.ui import WebDriverWait
    try:
        return WebDriverWait(d, timeout, poll_frequency=0.25).until(lambda drv: condition(drv))
    except Exception:
        shot = Path(os.environ.get("TMPDIR", "/tmp")) / "jupyterlab-failed.png"
        d.save_screenshot(str(shot))
        pytest.fail(f"the lab did not show {what} within {timeout:.0f} s (screenshot: {shot})")


def test_lab_opens_on_the_start_page_and_reading_a_notebook_changes_nothing(lab, tmp_path):
    reason = browser.why_not_possible()
    if reason:
        pytest.skip(reason)
    from selenium.webdriver.common.by import By
    base, token, headers = lab
    notebook = NOTEBOOKS / OPENED_NOTEBOOK
    before = notebook.read_bytes()
    d = browser.driver(1400, 900)
    try:
        d.get(f"{base}/?token={token}")   # what a learner opens: the default page
        title = _wait(d, "the rendered start page", lambda drv: next(
            (h for h in drv.find_elements(By.CSS_SELECTOR, ".jp-RenderedMarkdown h1") if h.text == "Start here"), None))
        assert title.is_displayed()
        assert d.current_url.split("?")[0].endswith(START_PAGE), d.current_url
        names = _wait(d, "the notebooks in the file browser", lambda drv: [
            e for e in drv.find_elements(By.CSS_SELECTOR, ".jp-DirListing-itemText")
            if e.text.endswith(".ipynb")] or None)
        assert {e.text for e in names} >= {p.name for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")}
        assert not d.find_elements(By.CSS_SELECTOR, ".jp-id-modified"), "the Modified column takes the names' width"
        cut = [e.text for e in names if d.execute_script(
            "return arguments[0].scrollWidth > arguments[0].clientWidth", e)]
        assert not cut, f"the file browser cuts these names short: {cut}"
        d.save_screenshot(str(tmp_path / "first-screen.png"))

        # the start page's link opens the notebook; its kernel starts and goes idle
        link = next(a for a in d.find_elements(By.CSS_SELECTOR, ".jp-RenderedMarkdown a") if a.text == LINK_TEXT)
        link.click()
        _wait(d, f"{OPENED_NOTEBOOK} with its kernel idle", lambda drv: any(
            "Idle" in e.text for e in drv.find_elements(By.CSS_SELECTOR, ".jp-StatusBar-TextItem")))
        # the kernel's info reply (language_info) reaches the notebook's model before the status
        # bar can show Idle; two animation frames later its tab and any pop-up are drawn
        d.set_script_timeout(30)
        d.execute_async_script("const done = arguments[arguments.length - 1];"
                               "requestAnimationFrame(() => requestAnimationFrame(() => setTimeout(done, 0)));")
        tab = next(t for t in d.find_elements(By.CSS_SELECTOR, ".lm-DockPanel-tabBar .lm-TabBar-tab")
                   if t.text == OPENED_NOTEBOOK)
        assert "jp-mod-dirty" not in tab.get_attribute("class"), \
            "opening the notebook marked it modified: its kernelspec or language_info differs from the kernel's"
        toasts = [t.text for t in d.find_elements(By.CSS_SELECTOR, ".Toastify__toast")]
        assert not toasts, f"a pop-up on the first screen: {toasts}"
        severe = [e["message"] for e in d.get_log("browser") if e["level"] == "SEVERE"]
        assert not severe, severe
        d.save_screenshot(str(tmp_path / "notebook.png"))
        print(f"screenshots: {tmp_path}/first-screen.png, {tmp_path}/notebook.png")
    finally:
        d.quit()
    assert notebook.read_bytes() == before
