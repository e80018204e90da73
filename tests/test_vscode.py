"""The VS Code extension (editors/vscode): a clean `npm ci`, the TypeScript build, its unit tests
(the extension's own logic, run under Node with a stubbed `vscode` module) and the .vsix
package, all in a copy of the folder so the working tree is left alone. A real VS Code cannot be
downloaded here: editors/README.md says what this does and does not cover.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

pytestmark = pytest.mark.editor

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXT = ROOT / "editors" / "vscode"
NPM = shutil.which("npm")
NODE = shutil.which("node")

needs_npm = pytest.mark.skipif(NPM is None or NODE is None, reason="npm/node not found on PATH")


def run(cmd: list[str], cwd: pathlib.Path, timeout: float) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, (
        f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}")
    return proc


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> pathlib.Path:
    """A copy of the extension after `npm ci` and `npm run compile`."""
    major = int(subprocess.run([NODE, "--version"], capture_output=True, text=True)
                .stdout.strip().lstrip("v").split(".")[0])
    if major < 20:
        pytest.skip(f"Node {major} is too old: @vscode/vsce needs Node 20 or newer")
    work = tmp_path_factory.mktemp("vscode") / "vscode"
    shutil.copytree(EXT, work, ignore=shutil.ignore_patterns("node_modules", "out", "*.vsix"))
    # --prefer-offline: the npm cache answers when it can, so a second run needs no network.
    run([NPM, "ci", "--no-audit", "--no-fund", "--prefer-offline"], work, timeout=900)
    run([NPM, "run", "compile"], work, timeout=300)
    return work


@needs_npm
def test_unit_tests_pass(built):
    proc = run([NPM, "test"], built, timeout=300)
    passed = re.search(r"^# pass (\d+)", proc.stdout, re.M)
    failed = re.search(r"^# fail (\d+)", proc.stdout, re.M)
    assert passed and failed, proc.stdout[-3000:]
    assert int(failed.group(1)) == 0
    # settings, status and extension tests all ran (a missing file would silently pass).
    assert int(passed.group(1)) >= 20, proc.stdout[-3000:]


@needs_npm
def test_vsix_holds_the_compiled_extension_and_its_runtime_dependencies(built):
    run([NPM, "run", "package"], built, timeout=600)
    vsix = built / "codespec-lsp.vsix"
    assert vsix.exists()
    with zipfile.ZipFile(vsix) as z:
        names = set(z.namelist())
        manifest = json.loads(z.read("extension/package.json"))
        client = json.loads(z.read("extension/node_modules/vscode-languageclient/package.json"))
    assert "extension/" + manifest["main"].lstrip("./") in names
    assert {"extension/out/src/settings.js", "extension/out/src/status.js"} <= names
    # Only what runs inside VS Code: no sources, tests, or build tools.
    assert not [n for n in names if n.startswith(("extension/src/", "extension/test/",
                                                  "extension/out/test/"))]
    assert not [n for n in names if "/node_modules/typescript/" in n or "/@vscode/vsce" in n]
    # vscode-languageclient 10.0.1 is the first with inline completion built in.
    major, minor, patch = (int(x) for x in client["version"].split(".")[:3])
    assert (major, minor, patch) >= (10, 0, 1)


def test_settings_mirror_the_server():
    """Every server-side setting in package.json is one codespec_lsp.config reads, and the
    other way round for the settings a user picks (model pair, device, budgets)."""
    from dataclasses import fields

    from codespec_lsp import config

    props = json.loads((EXT / "package.json").read_text())["contributes"]["configuration"]["properties"]
    client_only = {"server.path", "server.args", "languages", "trace.server"}
    server_side = {k.removeprefix("codespec.") for k in props} - client_only
    snake = {re.sub(r"(?<!^)(?=[A-Z])", "_", k).lower() for k in server_side}
    server_fields = {f.name for f in fields(config.Settings)}
    assert snake <= server_fields, snake - server_fields
    wanted = {"enable", "preset", "draft", "target", "device", "max_tokens", "debounce_ms",
              "context_tokens"}
    assert wanted <= snake, wanted - snake


def _server_executable() -> str | None:
    beside = pathlib.Path(sys.executable).parent / "codespec-lsp"
    return str(beside) if beside.exists() else shutil.which("codespec-lsp")


@needs_npm
@pytest.mark.slow
def test_extension_against_the_real_server(built, tmp_path):
    """The compiled extension with the real vscode-languageclient, starting the real server on
    the embedded pair; only VS Code itself is replaced (editors/vscode/itest/vscode-shim.ts)."""
    server = _server_executable()
    if server is None:
        pytest.skip("the codespec-lsp console script is not installed (pip install -e .)")
    log = tmp_path / "server.log"
    env = dict(os.environ, CODESPEC_LSP=server, CODESPEC_LSP_LOG=str(log))
    proc = subprocess.run([NPM, "run", "test:server"], cwd=built, env=env, capture_output=True,
                          text=True, timeout=900, stdin=subprocess.DEVNULL)
    server_log = log.read_text(errors="replace")[-4000:] if log.exists() else "(no server log)"
    assert proc.returncode == 0, f"{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}\n--- server log\n{server_log}"
    assert re.search(r"^# pass 1$", proc.stdout, re.M), proc.stdout[-3000:]
