"""In CI a skipped end-to-end test fails the run (tests/conftest.py); elsewhere it still skips."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

CONFTEST = Path(__file__).with_name("conftest.py").read_text()
E2E_TEST = """
import pytest
def test_editor():
    pytest.skip("missing: chromium (apt-get install chromium)")
"""
MODULE_SKIP = """
import pytest
pytest.skip("nvim not found", allow_module_level=True)
def test_nvim():
    pass
"""
UNIT_TEST = """
import pytest
def test_other():
    pytest.skip("not an end-to-end test")
"""


def _run(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_vscode_e2e.py").write_text(E2E_TEST)
    (tmp_path / "test_nvim.py").write_text(MODULE_SKIP)
    (tmp_path / "test_other.py").write_text(UNIT_TEST)
    env = {k: v for k, v in __import__("os").environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider",
                           str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("ci", ["true", "1"])
def test_in_ci_a_skipped_end_to_end_test_fails_the_run(tmp_path, ci):
    out = _run(tmp_path, ci)
    assert out.returncode != 0, out.stdout
    assert "must run, but it skipped: missing: chromium (apt-get install chromium)" in out.stdout
    assert "test_nvim.py must run, but it skipped: nvim not found" in out.stdout
    assert "SKIPPED" in out.stdout and "not an end-to-end test" in out.stdout  # others still skip


@pytest.mark.parametrize("ci", [None, "false"])
def test_outside_ci_it_still_skips_saying_what_to_install(tmp_path, ci):
    out = _run(tmp_path, ci)
    assert out.returncode == 0, out.stdout
    assert "3 skipped" in out.stdout and "apt-get install chromium" in out.stdout
