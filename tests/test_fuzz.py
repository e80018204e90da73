"""Fuzzing the real server (embedded pair, stdio) with mixed valid and invalid messages
(issue 13, "In CI"): no crash, every request answered within 10 s, and each document's text
equal to a reference model of the same edits.

Seeded and derandomized, so a run is reproducible; bounded by FUZZ_EXAMPLES (default 400,
about 30 s on two busy cores; the tiny pair answers in milliseconds). The reference model below is written independently of
documents.py, from the LSP spec: lines end at \\n, \\r\\n or \\r; positions count UTF-16 code
units; a character past the line end is the line end, a line past the last is the end; a
position inside a surrogate pair is after it; a reversed range is the normal one; an older
version than the document's is dropped.
"""

import itertools
import json
import os
import re
import sys

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from raw_lsp import RawServer

pytestmark = pytest.mark.slow

SERVE = [sys.executable, "-m", "codespec_lsp.cli", "serve", "--preset", "tiny", "--device", "cpu"]
ANSWER_S = 10
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "400"))
_BREAK = re.compile(r"\r\n|\r|\n")
_uris = itertools.count()


# ------------------------------------------------------------------ the reference model

def ref_offset(text: str, line: int, char: int) -> int:
    starts = [0] + [m.end() for m in _BREAK.finditer(text)]
    if line >= len(starts):
        return len(text)
    start = starts[line]
    end = starts[line + 1] if line + 1 < len(starts) else len(text)
    body_end = end - len(m.group()) if (m := _BREAK.search(text, start, end)) else end
    i, units = start, 0
    while i < body_end and units < char:
        units += 2 if ord(text[i]) > 0xFFFF else 1
        i += 1
    return i


def ref_apply(text: str, sl: int, sc: int, el: int, ec: int, new: str) -> str:
    a, b = ref_offset(text, sl, sc), ref_offset(text, el, ec)
    a, b = min(a, b), max(a, b)
    return text[:a] + new + text[b:]


def test_reference_model_examples():
    assert ref_apply("x = os.getcw", 0, 99, 0, 99, "d") == "x = os.getcwd"
    assert ref_apply("a\fb\nc", 1, 1, 1, 1, "!") == "a\fb\nc!"
    assert ref_apply("a😀b", 0, 2, 0, 3, "X") == "a😀Xb"  # 0:2 is inside the pair: after it
    assert ref_apply("ab\r\ncd", 0, 5, 1, 1, "") == "abd"


# ------------------------------------------------------------------ messages

PIECES = ["x", " ", "def ", "(", ")", ":", "\n", "\r\n", "\r", "\t", "\f", "\v", "\x85",
          "\u2028", "é", "日本", "😀", "\ud800", "    return ", "import os", '"', "\\", "{}"]
text_st = st.lists(st.sampled_from(PIECES), max_size=6).map("".join)
pos_st = st.tuples(st.integers(0, 6), st.integers(0, 40))

GARBAGE = [
    b"Content-Length: 99999999999\r\n\r\n",
    b"\x00\x01 not a header\r\n",
    b"Content-Length: 5\r\n\r\n{oops",
    b'Content-Length: 30\r\n\r\n{"jsonrpc":"2.0","id":"g1","method":"codespec/stats"}',
    b'Content-Length: 60\r\n\r\n{"jsonrpc":"2.0","id":"g2","method":"codespec/stats"}',
    b'content-length: 51\n\n{"jsonrpc":"2.0","id":"g3","method":"codespec/stats"}',
]
BAD_BODIES = [
    b'{"jsonrpc":"2.0","id":"b1","method":"codespec/stats","params":{"x":"\xff"}}',
    b"[1, 2, 3]",
    b'"just a string"',
    b'{"jsonrpc":"2.0","id":"b2","method":"textDocument/inlineCompletion","params":{}}',
    b'{"jsonrpc":"2.0","id":"b3","method":"no/such/method","params":null}',
    b'{"jsonrpc":"2.0","method":"textDocument/didChange","params":{"contentChanges":7}}',
    b'{"jsonrpc":"2.0","id":"b4","method":"workspace/executeCommand","params":'
    b'{"command":"codespec.didAcceptCompletion","arguments":[{"a":{}}]}}',
    b'{"jsonrpc":"2.0","id":"b5","method":"codespec/stats","params":{"jsonrpc":"2.0"}}',
    b'{"jsonrpc":"1.0","id":"b6","method":"codespec/stats"}',
]

action_st = st.one_of(
    st.tuples(st.just("edit"), st.integers(0, 2), pos_st, pos_st, text_st, st.booleans()),
    st.tuples(st.just("complete"), st.integers(0, 2), pos_st, st.booleans()),
    st.tuples(st.just("garbage"), st.sampled_from(GARBAGE)),
    st.tuples(st.just("bad"), st.sampled_from(BAD_BODIES)),
    st.tuples(st.just("full"), st.integers(0, 2), text_st),
)


@pytest.fixture(scope="module")
def server():
    s = RawServer(SERVE)
    s.initialize({"debounceMs": 0, "maxTokens": 6})
    for i in range(240):  # the pair loads in the background
        if s.request(f"load-{i}", "codespec/stats", timeout=ANSWER_S)["result"]["state"] != \
                "loading":
            break
        import time
        time.sleep(0.5)
    yield s
    assert s.request("bye", "shutdown", timeout=ANSWER_S)["result"] is None
    s.notify("exit")
    assert s.close() == 0  # no crash along the way, and a clean exit


@seed(1313)
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(start=st.lists(text_st, min_size=3, max_size=3),
       actions=st.lists(action_st, min_size=1, max_size=30))
def test_fuzz_mixed_messages(server, start, actions):
    n = next(_uris)
    uris = [f"file:///fuzz/{n}/doc{i}.py" for i in range(3)]
    texts = list(start)
    versions = [1, 1, 1]
    for uri, text in zip(uris, texts):
        server.open(uri, text)
    for k, action in enumerate(actions):
        kind = action[0]
        if kind == "edit":
            _, d, (sl, sc), (el, ec), new, stale = action
            version = versions[d] - 1 if stale else versions[d] + 1
            server.change(uris[d], version, {"range": {
                "start": {"line": sl, "character": sc}, "end": {"line": el, "character": ec}},
                "text": new})
            if not stale:
                versions[d] = version
                texts[d] = ref_apply(texts[d], sl, sc, el, ec, new)
        elif kind == "full":
            _, d, new = action
            versions[d] += 1
            server.change(uris[d], versions[d], {"text": new})
            texts[d] = new
        elif kind == "complete":
            _, d, (line, char), cancel = action
            msg_id = f"c{n}-{k}"
            server.send({"jsonrpc": "2.0", "id": msg_id,
                         "method": "textDocument/inlineCompletion", "params": {
                             "textDocument": {"uri": uris[d]},
                             "position": {"line": line, "character": char},
                             "context": {"triggerKind": 2}}})
            if cancel:
                server.notify("$/cancelRequest", {"id": msg_id})
            answer = server.response(msg_id, ANSWER_S)
            assert "result" in answer or answer["error"]["code"] == -32800, answer
        elif kind == "garbage":
            server.write(action[1])
        else:
            server.send(action[1])
    for i, uri in enumerate(uris):
        # Answered within 10 s even after the garbage, and equal to the reference model.
        got = server.request(f"t{n}-{i}", "codespec/documentText",
                             {"textDocument": {"uri": uri}}, ANSWER_S)
        assert got["result"]["text"] == texts[i], (json.dumps(texts[i]), got)
    for uri in uris:
        server.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
    server.drain(0)
    server.responses.clear()  # answers to the garbage's own ids, and id-less parse errors


def test_a_lone_surrogate_in_one_document_does_not_empty_another(server):
    """Issue 13, item 5: its text reached the tokenizer as "other open files" and raised."""
    code = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return "

    def ask(msg_id):
        return server.request(msg_id, "textDocument/inlineCompletion", {
            "textDocument": {"uri": "file:///fuzz/good.py"},
            "position": {"line": 5, "character": 11}, "context": {"triggerKind": 1}},
            ANSWER_S)["result"]["items"]

    server.open("file:///fuzz/good.py", code)
    alone = ask("s1")
    server.open("file:///fuzz/bad.py", "s = '\ud800'\n")
    with_bad = ask("s2")
    assert alone, "the pair should complete this"
    assert with_bad, "a lone surrogate in another document emptied this one's answers"
