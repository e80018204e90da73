"""`bench server` in small: the soak (issue 13: 5 documents, typing with cancels, every request
answered, the server's documents equal to the client's), a corpus with a file that has nothing
to type (it crashed with "coroutine raised StopIteration"), and --clients over TCP with one
session per connection. Fake engine; counts and bounds, no timings."""

import argparse
import sys
from pathlib import Path

import pytest

from codespec_lsp.bench.server import run_bench, run_clients, run_soak

pytestmark = pytest.mark.slow

FAKE = [sys.executable, str(Path(__file__).with_name("fake_engine.py")), "--debounce-ms", "0"]
CODE = "def f(x):\n    return x + 1\n\n\nprint(f(2))\n" * 4


def args(tmp_path, **kw) -> argparse.Namespace:
    base = dict(keystrokes=120, interval_ms=5, corpus=str(tmp_path), documents=5)
    return argparse.Namespace(**{**base, **kw})


async def test_soak_answers_every_request_and_keeps_the_documents(tmp_path):
    for name in ("a", "b", "c"):
        (tmp_path / f"{name}.py").write_text(CODE.replace("f", name))
    out = await run_soak(args(tmp_path, keystrokes=300), server_command=FAKE)
    assert out["documents"] == 5 and out["keystrokes"] == 300
    assert out["unanswered"] == 0
    assert out["answered_with_result"] + out["answered_cancelled"] \
        + out["answered_with_error"] == 300
    assert out["answered_with_error"] == 0 and out["error_messages"] == 0
    assert out["documents_equal"] == 5  # 300 keystrokes over 5 files, each as the client has it
    assert out["exit_code"] == 0
    assert len(out["rss_mb_samples"]) >= 2 and all(x > 0 for x in out["rss_mb_samples"])


async def test_a_file_with_nothing_to_type_is_skipped(tmp_path):
    (tmp_path / "empty.py").write_text("")
    (tmp_path / "one_line.py").write_text("x = 1\n")  # all of it is the given context
    (tmp_path / "real.py").write_text(CODE)
    out = await run_bench(args(tmp_path, keystrokes=30), server_command=FAKE)
    assert out["keystrokes"] == 30 and out["last_keystroke_answered"] is True


async def test_a_corpus_with_nothing_to_type_is_a_clear_error(tmp_path):
    (tmp_path / "empty.py").write_text("")
    with pytest.raises(SystemExit, match="anything to type"):
        await run_bench(args(tmp_path, keystrokes=5), server_command=FAKE)


async def test_clients_over_tcp_each_get_their_own_session(tmp_path):
    (tmp_path / "a.py").write_text(CODE)
    (tmp_path / "b.py").write_text(CODE.replace("f", "g"))
    out = await run_clients(args(tmp_path, keystrokes=40, tcp=True), [2],
                            server_command=FAKE)
    assert out["transport"] == "tcp"
    (run,) = out["runs"]
    assert run["clients"] == 2 and run["errors"] == 0
    for client in run["per_client"]:
        assert client["last_keystroke_answered"] is True
        # Each session counts its own requests only (a shared session would count 80).
        assert 0 < client["answered"] + client["cancelled"] + client["superseded"] <= 40
