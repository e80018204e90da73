"""Issue 13 over a real stdio server (fake engine, no torch): raw JSON-RPC as a probe sends it.

Each test reproduces one item of the issue and failed before the hardened protocol layer
(lsp_protocol.py) and document model (documents.py). One server for the module; the lifecycle
tests start their own.
"""

import json

import pytest

from raw_lsp import RawServer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server():
    s = RawServer()
    s.initialize()
    yield s
    s.request("bye", "shutdown")
    s.notify("exit")
    assert s.close() == 0


def still_serving(s: RawServer, tag: str) -> None:
    assert s.request(f"alive-{tag}", "codespec/stats")["result"]["state"] in ("ready", "loading")


def inline(s: RawServer, msg_id, uri: str, line: int, char: int) -> dict:
    return s.request(msg_id, "textDocument/inlineCompletion", {
        "textDocument": {"uri": uri}, "position": {"line": line, "character": char},
        "context": {"triggerKind": 1}}, timeout=30)


def edit(sl, sc, el, ec, text) -> dict:
    return {"range": {"start": {"line": sl, "character": sc},
                      "end": {"line": el, "character": ec}}, "text": text}


# ------------------------------------------------------------------ data (items 1-4)

def test_1_form_feed_is_not_a_line_break(server):
    uri = "file:///p/ff.py"
    server.open(uri, "a = 1\f\nimport os\nos.pa")
    server.change(uri, 2, edit(2, 5, 2, 5, "th"))
    assert server.text(uri) == "a = 1\f\nimport os\nos.path"
    # Line 3 is past the end (there are 3 lines): nothing, not a completion of "import os".
    assert inline(server, "ff-past", uri, 3, 0)["result"]["items"] == []


def test_2_edit_past_the_line_end_goes_at_the_end(server):
    uri = "file:///p/getcwd.py"
    server.open(uri, "x = os.getcw")
    server.change(uri, 2, edit(0, 99, 0, 99, "d"))
    assert server.text(uri) == "x = os.getcwd"


def test_3_reversed_range_never_corrupts(server):
    uri = "file:///p/reversed.py"
    server.open(uri, "first line\nsecond line here is long\n")
    server.change(uri, 2, edit(1, 20, 1, 9, "X"))
    assert server.text(uri) == "first line\nsecond liXlong\n"


def test_4_stale_version_keeps_the_newest_text(server):
    uri = "file:///p/stale.py"
    server.open(uri, "v1")
    server.change(uri, 5, edit(0, 0, 0, 2, "v5"))
    server.change(uri, 3, edit(0, 0, 0, 2, "v3"))
    assert server.text(uri) == "v5"


# ------------------------------------------------------------------ protocol (items 6-8, 10-12)

def test_6_params_with_a_jsonrpc_key_are_answered(server):
    server.send({"jsonrpc": "2.0", "id": 6, "method": "codespec/stats",
                 "params": {"jsonrpc": "2.0"}})
    assert "result" in server.response(6)


def test_7_body_that_is_not_utf8_gets_a_parse_error(server):
    server.send(b'{"jsonrpc":"2.0","id":7,"method":"codespec/stats","params":{"x":"\xff\xfe"}}')
    answer = server.response(7)
    assert answer["error"]["code"] == -32700
    still_serving(server, "7")


@pytest.mark.parametrize("name,frame", [
    ("short", lambda b: b"Content-Length: %d\r\n\r\n" % (len(b) - 10) + b),
    ("long", lambda b: b"Content-Length: %d\r\n\r\n" % (len(b) + 10) + b),
    ("lower-case", lambda b: b"content-length: %d\r\n\r\n" % len(b) + b),
    ("newline-only", lambda b: b"Content-Length: %d\n\n" % len(b) + b),
    ("garbage-before", lambda b: b"\x00garbage\r\n" + b"Content-Length: %d\r\n\r\n" % len(b) + b),
    ("header-without-body", lambda b: b"Content-Length: 40\r\n\r\n"
                                      + b"Content-Length: %d\r\n\r\n" % len(b) + b),
])
def test_8_misframed_messages_cost_at_most_themselves(server, name, frame):
    body = json.dumps({"jsonrpc": "2.0", "id": f"f-{name}", "method": "codespec/stats"}).encode()
    server.write(frame(body))
    # The next well-framed request is always answered.
    still_serving(server, name)


def test_8_huge_content_length_is_refused_and_the_server_lives(server):
    server.drain()
    server.responses.pop(None, None)  # id-less parse errors of earlier misframed messages
    server.write(b"Content-Length: 99999999999\r\n\r\n")
    refused = server.response(None)
    assert refused["error"]["code"] == -32600 and "limit" in refused["error"]["message"]
    still_serving(server, "huge")


def test_10_second_initialize_is_refused_and_documents_stay(server):
    uri = "file:///p/kept.py"
    server.open(uri, "kept = True\n")
    answer = server.request("init-2", "initialize", {"processId": None, "capabilities": {}})
    assert answer["error"]["code"] == -32600
    assert server.text(uri) == "kept = True\n"


def test_11_accept_command_with_an_object_is_invalid_params(server):
    answer = server.request(11, "workspace/executeCommand", {
        "command": "codespec.didAcceptCompletion", "arguments": [{"not": {"an": "id"}}]})
    assert answer["error"]["code"] == -32602, answer
    ok = server.request("11-ok", "workspace/executeCommand", {
        "command": "codespec.didAcceptCompletion", "arguments": ["no-such-id"]})
    assert "error" not in ok


def test_12_malformed_notifications_show_one_message_at_most(server):
    server.drain()
    before = len(server.messages_shown())
    for v in range(5):
        server.notify("textDocument/didChange", {"textDocument": {"uri": 5}, "contentChanges": v})
        server.notify("textDocument/didOpen", {"textDocument": None})
    still_serving(server, "12")
    server.drain()
    errors = [m for m in server.messages_shown()[before:] if m["type"] == 1]
    assert len(errors) <= 2  # one per kind (didChange, didOpen), not one per message


# ------------------------------------------------------------------ lifecycle (item 9)

def test_9_exit_without_shutdown_exits_1():
    s = RawServer()
    s.initialize()
    s.notify("exit")
    assert s.close() == 1


def test_9_requests_after_shutdown_are_invalid_requests_and_exit_is_0():
    s = RawServer()
    s.initialize()
    assert s.request("down", "shutdown")["result"] is None
    assert s.request("late", "codespec/stats")["error"]["code"] == -32600
    s.notify("exit")
    assert s.close() == 0


def test_requests_before_initialize_are_not_initialized():
    s = RawServer()
    try:
        assert s.request("early", "codespec/stats")["error"]["code"] == -32002
    finally:
        s.proc.kill()
        s.close()
