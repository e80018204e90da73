"""`bench server --clients N`: N editors at once, each its own language server, one backend."""

import argparse
import pathlib
import sys

from codespec_lsp.bench.server import _client_counts, run_clients

FAKE = [sys.executable, str(pathlib.Path(__file__).with_name("fake_engine.py")), "--debounce-ms", "0"]


async def test_clients_sweep_reports_latency_and_errors_per_count(tmp_path):
    for name in ("a", "b"):
        (tmp_path / f"{name}.py").write_text(f"def {name}(x):\n    return x + 1\n\n\n" * 5)
    args = argparse.Namespace(keystrokes=15, interval_ms=20, corpus=str(tmp_path))
    out = await run_clients(args, [1, 2], server_command=FAKE)
    assert [run["clients"] for run in out["runs"]] == [1, 2]
    assert out["backend"] == "local" and out["keystrokes_per_client"] == 15
    for run in out["runs"]:
        assert len(run["per_client"]) == run["clients"]
        assert run["errors"] == 0 and run["latency_ms_p95"] >= run["latency_ms_p50"] > 0
        for client in run["per_client"]:
            assert client["answered"] + client["cancelled"] + client["superseded"] == 15
            assert client["last_keystroke_answered"] is True


def test_client_counts_parse():
    assert _client_counts("4") == [4] and _client_counts("1,2,4") == [1, 2, 4]
