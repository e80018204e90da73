"""The VS Code extension (editors/vscode): a clean `npm ci`, the TypeScript build, its unit tests
(the extension's own logic, run under Node with a stubbed `vscode` module) and the .vsix
package, all in a copy of the folder so the working tree is left alone. The real VS Code
(code-server in headless Chromium) is tests/test_vscode_e2e.py.
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
def test_vsix_is_the_bundle_and_the_manifest(built):
    """esbuild bundles the extension with vscode-languageclient into one file: the .vsix holds
    it, the manifest, readme and licence, and nothing else (no sources, tests, node_modules)."""
    run([NPM, "run", "package"], built, timeout=600)
    vsix = built / "codespec-lsp.vsix"
    assert vsix.exists()
    with zipfile.ZipFile(vsix) as z:
        names = {n for n in z.namelist() if not n.endswith("/")}
        manifest = json.loads(z.read("extension/package.json"))
        bundle = z.read("extension/dist/extension.js").decode()
    assert names == {"[Content_Types].xml", "extension.vsixmanifest", "extension/package.json",
                     "extension/readme.md", "extension/LICENSE.txt", "extension/dist/extension.js"}
    assert manifest["main"] == "./dist/extension.js"
    assert "dependencies" not in manifest, "runtime dependencies belong in the bundle"
    # The client is inside the bundle; `vscode` is the one module left to VS Code.
    assert "inlineCompletionProvider" in bundle and 'require("vscode")' in bundle
    # vscode-languageclient 10.0.1 is the first with inline completion built in.
    client = json.loads((built / "node_modules" / "vscode-languageclient" / "package.json").read_text())
    major, minor, patch = (int(x) for x in client["version"].split(".")[:3])
    assert (major, minor, patch) >= (10, 0, 1)


def test_manifest_activation_scopes_and_trust():
    """What VS Code reads from package.json before any code runs."""
    manifest = json.loads((EXT / "package.json").read_text())
    props = manifest["contributes"]["configuration"]["properties"]
    # Activation cannot follow codespec.languages: the extension activates after start-up and
    # starts the server when a document of one of those languages opens (src/extension.ts).
    assert "onStartupFinished" in manifest["activationEvents"]
    # Settings that pick the program, send code elsewhere or run a checkpoint's code are the
    # user's own: a cloned repository's .vscode/settings.json cannot set them.
    for key in ("server.path", "server.args", "allowDownload", "trustRemoteCode", "remote",
                "apiKeyEnv"):
        assert props[f"codespec.{key}"].get("scope") == "machine", key
    trust = manifest["capabilities"]["untrustedWorkspaces"]
    assert trust["supported"] == "limited"
    machine = {k for k, v in props.items() if v.get("scope") == "machine"}
    restricted = set(trust["restrictedConfigurations"])
    assert restricted and not restricted & machine and restricted <= set(props)
    assert {"codespec.preset", "codespec.draft", "codespec.target"} <= restricted
    assert manifest["repository"]["directory"] == "editors/vscode"
    # One name everywhere: the package, the .vsix, and editors/README.md's install line.
    assert manifest["name"] == "codespec-lsp"
    assert "codespec-lsp.vsix" in manifest["scripts"]["package"]
    assert "code --install-extension codespec-lsp.vsix" in (ROOT / "editors" / "README.md").read_text()
    for key, spec in props.items():
        assert spec.get("description") or spec.get("markdownDescription"), key


def test_settings_mirror_the_server():
    """Every server setting is a VS Code setting, and every server-side setting in package.json
    is one codespec_lsp.config reads, with a matching type."""
    from dataclasses import fields

    from codespec_lsp import config
    props = json.loads((EXT / "package.json").read_text())["contributes"]["configuration"]["properties"]
    client_only = {"server.path", "server.args", "languages", "trace.server"}
    server_side = {k.removeprefix("codespec."): v for k, v in props.items()
                   if k.removeprefix("codespec.") not in client_only}
    snake = {re.sub(r"(?<!^)(?=[A-Z])", "_", k).lower(): k for k in server_side}
    server_fields = {f.name: f for f in fields(config.Settings)}
    assert set(snake) <= set(server_fields), sorted(set(snake) - set(server_fields))
    assert set(server_fields) <= set(snake), sorted(set(server_fields) - set(snake))
    json_types = {bool: "boolean", int: "integer", float: "number", str: "string"}
    for name, key in snake.items():
        default = server_fields[name].default
        declared = server_side[key]["type"]
        declared = declared if isinstance(declared, list) else [declared]
        if default is not None:
            want = json_types[type(default)]
            assert want in declared or (want == "integer" and "number" in declared), (key, declared)


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
