"""The VS Code extension in a real VS Code: code-server 4.139.1 (VS Code 1.139 in a browser) runs
the packaged .vsix, Debian's chromium (headless, driven by puppeteer-core) is the window, and the
real server completes on the embedded pair.

editors/vscode/e2e/drive.mjs opens a Python file, types, waits for the ghost text, presses Tab and
saves; then types a line fast and reads what is drawn. The assertions live here.

code-server builds native modules against Node 24 on install, so `bash scripts/setup.sh
vscode-e2e` (run by `make test`) installs it once into a cache outside the clone and writes
editors/vscode/e2e/.state.json: where it is, or why there is none. Without it this test skips and
says why.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

pytestmark = [pytest.mark.editor, pytest.mark.slow]

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXT = ROOT / "editors" / "vscode"
E2E = EXT / "e2e"
STATE = E2E / ".state.json"
NPM = shutil.which("npm")

SOURCE = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'
TYPE_SLOW = "    if n"
TYPE_FAST = "    result = fibonacci(n - 1) + fibonacci("
WAIT_MS = 240_000


def _setup() -> dict:
    if not STATE.exists():
        pytest.skip("the real VS Code is not set up: run `make test` or "
                    "`bash scripts/setup.sh vscode-e2e`")
    state = json.loads(STATE.read_text())
    if not state.get("ok"):
        pytest.skip(f"the real VS Code set-up did not run: {state.get('reason')}")
    folder = pathlib.Path(state["dir"])
    if not (folder / ".done").exists():
        pytest.skip(f"the real VS Code set-up in {folder} is gone: run `bash scripts/setup.sh vscode-e2e`")
    return {"dir": folder, "node": folder / "node24" / "node_modules" / ".bin" / "node",
            "code_server": folder / "node_modules" / "code-server" / "out" / "node" / "entry.js"}


def _chromium() -> str:
    found = os.environ.get("CODESPEC_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        pytest.skip("chromium not found (apt-get install chromium, or set CODESPEC_CHROMIUM)")
    return found


def _server_executable() -> str:
    beside = pathlib.Path(sys.executable).parent / "codespec-lsp"
    found = str(beside) if beside.exists() else shutil.which("codespec-lsp")
    if not found:
        pytest.skip("the codespec-lsp console script is not installed (pip install -e .)")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(cmd: list, cwd: pathlib.Path, timeout: float, env: dict | None = None) -> str:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, env=env)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def vsix(tmp_path_factory) -> pathlib.Path:
    """The packaged extension, built in a copy of the folder as a user would."""
    if NPM is None:
        pytest.skip("npm not found")
    work = tmp_path_factory.mktemp("vsix") / "vscode"
    shutil.copytree(EXT, work, ignore=shutil.ignore_patterns("node_modules", "out", "dist", "e2e", "*.vsix"))
    _run([NPM, "ci", "--no-audit", "--no-fund", "--prefer-offline"], work, timeout=900)
    _run([NPM, "run", "package"], work, timeout=600)
    return work / "codespec-lsp.vsix"


def test_type_see_ghost_text_accept_with_tab_then_fast_typing_shows_only_the_newest(vsix, tmp_path):
    setup, chromium, server = _setup(), _chromium(), _server_executable()
    user_data, extensions, ws = tmp_path / "user-data", tmp_path / "extensions", tmp_path / "ws"
    for d in (user_data / "User", extensions, ws):
        d.mkdir(parents=True)
    src = ws / "fib.py"
    src.write_text(SOURCE)
    server_log = tmp_path / "server.log"
    settings = json.dumps({
        "codespec.server.path": server,
        "codespec.server.args": ["--log-file", str(server_log)],
        "codespec.preset": "tiny",
        "codespec.device": "cpu",
        # Typed text stays literal, and no completion menu competes with the ghost text for Tab.
        "editor.autoClosingBrackets": "never",
        "editor.autoClosingQuotes": "never",
        "editor.quickSuggestions": {"other": "off", "comments": "off", "strings": "off"},
        "editor.suggestOnTriggerCharacters": False,
        "editor.inlineSuggest.enabled": True,
        "workbench.startupEditor": "none",
        "security.workspace.trust.enabled": False,
        "telemetry.telemetryLevel": "off",
        "update.mode": "none",
        "extensions.autoCheckUpdates": False,
        "extensions.autoUpdate": False,
        "chat.disableAIFeatures": True,
    })
    # code-server's extension host is a remote one: machine-scoped settings (codespec.server.path)
    # are read from Machine/, and from User/ only when the web client's copy has arrived, which
    # raced with the extension's start (it then ran "codespec-lsp" from PATH: ENOENT).
    for scope in ("User", "Machine"):
        (user_data / scope).mkdir(parents=True, exist_ok=True)
        (user_data / scope / "settings.json").write_text(settings)
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PATH=f"{setup['node'].parent}{os.pathsep}{os.environ.get('PATH', '')}")
    base = [setup["node"], setup["code_server"], "--user-data-dir", user_data,
            "--extensions-dir", extensions]
    _run([*base, "--install-extension", vsix], tmp_path, timeout=180, env=env)

    port = _free_port()
    cs_log = (tmp_path / "code-server.log").open("w")
    proc = subprocess.Popen(
        [str(c) for c in [*base, "--auth", "none", "--bind-addr", f"127.0.0.1:{port}",
                          "--disable-telemetry", "--disable-update-check",
                          "--disable-workspace-trust", "--disable-getting-started-override", ws]],
        cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stdout=cs_log, stderr=subprocess.STDOUT)
    out = tmp_path / "result.json"

    def report() -> str:
        parts = []
        for name, path in (("code-server log", tmp_path / "code-server.log"), ("server log", server_log)):
            if path.exists():
                parts.append(f"--- {name} (tail)\n{path.read_text(errors='replace')[-4000:]}")
        return "\n".join(parts)

    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2)
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "code-server did not start\n" + report()
                time.sleep(0.5)
        drive = subprocess.run(
            [str(setup["node"]), str(E2E / "drive.mjs")], cwd=tmp_path, capture_output=True,
            text=True, timeout=WAIT_MS * 3 / 1000, stdin=subprocess.DEVNULL,
            env=dict(env, E2E_DIR=str(setup["dir"]), E2E_URL=f"http://127.0.0.1:{port}/?folder={ws}",
                     E2E_FILE=src.name, E2E_OUT=str(out), E2E_CHROMIUM=chromium,
                     E2E_PROFILE=str(tmp_path / "chromium-profile"), E2E_TIMEOUT_MS=str(WAIT_MS),
                     E2E_TYPE_SLOW=TYPE_SLOW, E2E_TYPE_FAST=TYPE_FAST))
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        cs_log.close()

    assert out.exists(), f"the driver wrote nothing\n{drive.stdout[-3000:]}\n{drive.stderr[-3000:]}\n" + report()
    r = json.loads(out.read_text())
    assert r["ok"], f"{r.get('error')}\n" + "\n".join(r["log"]) + "\n" + report()

    # The ghost text appeared after the typed text, and Tab put it into the file.
    suggestion_first = "".join(r["shown"]["inline"])
    assert suggestion_first.strip()
    # The file was saved after the accept and again after the fast line; the accepted lines stay.
    lines = src.read_text().split("\n")
    accepted_line = lines[2]
    assert accepted_line == TYPE_SLOW + suggestion_first, (accepted_line, r["shown"])
    for i, below in enumerate(r["shown"]["below"]):
        assert lines[3 + i].rstrip() == below.rstrip(), (lines, r["shown"])

    # Fast typing: the line holds what was typed, one ghost text is drawn, at the cursor.
    final = src.read_text().rstrip("\n").split("\n")
    assert final[-1] == TYPE_FAST, final[-3:]
    fast = r["fast"]
    assert len([t for t in fast["inline"] if t.strip()]) == 1, fast
    box, cursor = fast["inlineBoxes"][0], fast["cursor"]
    assert abs(box["top"] - cursor["top"]) <= 2 and box["left"] >= cursor["left"] - 2, fast
    # ... and the extension's statistics show the stale requests were stopped, not answered.
    stats = {k: v for k, _, v in (item.partition(": ") for item in r["stats_items"])}
    assert int(stats["cancelled"]) + int(stats["superseded"]) >= 1, stats
