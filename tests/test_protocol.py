"""The hardened protocol in process (no subprocess): the framer's recovery rules and item 15 of
issue 13 (pygls kept the future of every handled notification: ~1.9 KB a keystroke)."""

import asyncio
import json

import pytest

from codespec_lsp.lsp.protocol import Framer, Refused
from fake_engine import FakeEngine


def frame(body: bytes, length: int | None = None, sep: bytes = b"\r\n") -> bytes:
    return b"Content-Length: %d" % (len(body) if length is None else length) + sep + sep + body


A = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "a"}).encode()
B = json.dumps({"jsonrpc": "2.0", "id": 2, "method": "b"}).encode()


@pytest.mark.parametrize("first", [
    frame(A), frame(A, len(A) - 10), frame(A, len(A) + 10), frame(A, sep=b"\n"),
    frame(A).replace(b"Content-Length", b"content-length"), b"junk\r\n" + frame(A),
])
def test_framer_resynchronises_at_the_next_header(first):
    out = Framer().feed(first + frame(B))
    assert out[-1] == B  # whatever happened to the first message, the next one is whole


def test_framer_finds_a_misframed_body_despite_non_utf8_bytes_after_it():
    # Found by test_fuzz.py: a strict decode of the whole buffer failed on the later \xff,
    # and the framer cut the valid message B in two.
    bad = b'{"jsonrpc":"2.0","id":3,"method":"c","params":{"x":"\xff"}}'
    out = Framer().feed(frame(A, len(A) + 10) + frame(B) + frame(bad))
    assert out == [A, B, bad]


def test_framer_refuses_a_huge_length_without_allocating_it():
    framer = Framer(limit=1000)
    out = framer.feed(b"Content-Length: 99999999999\r\n\r\n" + frame(B))
    assert isinstance(out[0], Refused) and out[-1] == B


def test_framer_takes_a_large_body_in_chunks():
    body = json.dumps({"jsonrpc": "2.0", "method": "x", "params": "y" * 300_000}).encode()
    data = frame(body)
    framer, out = Framer(), []
    for i in range(0, len(data), 4096):
        out += framer.feed(data[i:i + 4096])
    assert out == [body]


def test_framer_stalled_body_is_read_as_it_is():
    framer = Framer()
    assert framer.feed(frame(A, len(A) + 10)) == []
    assert framer.stalled() == [A]


class _Sink:
    def __init__(self) -> None:
        self.data: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.data.append(data)

    def close(self) -> None:
        pass


def _msg(**fields) -> bytes:
    return json.dumps({"jsonrpc": "2.0", **fields}).encode()


async def test_15_handled_notifications_leave_no_futures_behind():
    from codespec_lsp.lsp.server import build_server

    server = build_server(None, loader=lambda settings: FakeEngine())
    proto = server.protocol
    proto.set_writer(_Sink())
    proto.receive(_msg(id=1, method="initialize", params={"processId": None, "capabilities": {}}))
    proto.receive(_msg(method="initialized", params={}))
    uri = "file:///leak.py"
    proto.receive(_msg(method="textDocument/didOpen", params={"textDocument": {
        "uri": uri, "languageId": "python", "version": 1, "text": ""}}))
    for v in range(2, 2002):
        proto.receive(_msg(method="textDocument/didChange", params={
            "textDocument": {"uri": uri, "version": v},
            "contentChanges": [{"range": {"start": {"line": 0, "character": 9999},
                                          "end": {"line": 0, "character": 9999}}, "text": "x"}]}))
        if v % 200 == 0:
            await asyncio.sleep(0)
    await asyncio.sleep(0.1)
    try:
        assert proto.workspace.get_text_document(uri).source == "x" * 2000
        # pygls kept all 2,000 (+ initialize's steps); a bounded table keeps none of them.
        assert len(proto._request_futures) <= 2
    finally:
        await server.end_session()
