"""The real VS Code test's set-up never makes CI red: where its prerequisites are missing,
`scripts/setup.sh vscode-e2e` exits 0 and writes the reason, which the test skips with."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_missing_prerequisites_write_a_skip_with_the_reason_and_exit_0(tmp_path):
    # A copy of the clone's set-up script (its state file lands in the copy, not in this clone).
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    e2e = tmp_path / "editors" / "vscode" / "e2e"
    e2e.mkdir(parents=True)
    for name in ("package.json", "package-lock.json"):
        shutil.copy(ROOT / "editors" / "vscode" / "e2e" / name, e2e / name)
    # A PATH with only what the script needs to get as far as its checks: no npm, no chromium,
    # no compiler.
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for tool in ("bash", "dirname"):
        (bin_ / tool).symlink_to(shutil.which(tool))
    (bin_ / "python3").symlink_to(sys.executable)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CODESPEC_")}
    env.update(PATH=str(bin_), HOME=str(tmp_path / "home"), PYTHON=sys.executable)
    proc = subprocess.run([str(bin_ / "bash"), "scripts/setup.sh", "vscode-e2e"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    state = json.loads((e2e / ".state.json").read_text())
    assert state["ok"] is False
    assert "npm" in state["reason"] and "chromium" in state["reason"], state
    assert "skipped" in proc.stderr
    # Nothing was installed.
    assert not (tmp_path / "home" / ".cache").exists()
