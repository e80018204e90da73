"""Issue 13, items 13-14: TCP and WebSocket serve one session per connection, on 127.0.0.1,
and a browser page from an unlisted Origin cannot connect. Fake engine (no torch)."""

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

FAKE = [sys.executable, str(Path(__file__).with_name("fake_engine.py"))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(*flags: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen(FAKE + [*flags, "--port", str(port)], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return proc, port
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError("the server did not listen")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class TcpClient:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), 10)
        self.file = self.sock.makefile("rb")
        self.seen: list[dict] = []  # everything this connection received

    def send(self, msg: dict) -> None:
        body = json.dumps({"jsonrpc": "2.0", **msg}).encode()
        self.sock.sendall(b"Content-Length: %d\r\n\r\n" % len(body) + body)

    def read(self) -> dict:
        length = None
        while True:
            line = self.file.readline()
            if not line:
                raise EOFError
            if not line.strip():
                break
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        msg = json.loads(self.file.read(length))
        self.seen.append(msg)
        return msg

    def request(self, msg_id, method: str, params=None) -> dict:
        self.send({"id": msg_id, "method": method, "params": params})
        while True:
            msg = self.read()
            if msg.get("id") == msg_id and "method" not in msg:
                return msg
            if "method" in msg and "id" in msg:  # a server request (progress): answer it
                self.send({"id": msg["id"], "result": None})

    def initialize(self) -> None:
        assert "result" in self.request("init", "initialize",
                                        {"processId": None, "capabilities": {}})
        self.send({"method": "initialized", "params": {}})

    def open(self, uri: str, text: str) -> None:
        self.send({"method": "textDocument/didOpen", "params": {"textDocument": {
            "uri": uri, "languageId": "python", "version": 1, "text": text}}})

    def text(self, msg_id, uri: str) -> dict:
        return self.request(msg_id, "codespec/documentText", {"textDocument": {"uri": uri}})

    def close(self) -> None:
        self.sock.close()


def test_13_each_tcp_connection_is_its_own_session():
    proc, port = start("--tcp")
    try:
        a = TcpClient(port)
        a.initialize()
        a.open("file:///secret.py", "API_TOKEN = 'abc'\n")
        assert a.text(1, "file:///secret.py")["result"]["text"] == "API_TOKEN = 'abc'\n"

        b = TcpClient(port)  # a second client while the first is connected
        # Without initialize it is not served at all (it got the first client's completions).
        assert b.request(2, "codespec/documentText", {"textDocument": {
            "uri": "file:///secret.py"}})["error"]["code"] == -32002
        b.initialize()  # its own session: the first client's documents are not in it...
        assert b.text(3, "file:///secret.py")["error"]["code"] == -32602
        b.open("file:///b.py", "b = 1\n")
        # ...and its initialize did not wipe the first client's.
        assert a.text(4, "file:///secret.py")["result"]["text"] == "API_TOKEN = 'abc'\n"
        assert a.text(5, "file:///b.py")["error"]["code"] == -32602
        # No answer meant for one client reached the other.
        assert not any(m.get("id") in (2, 3) for m in a.seen)
        assert not any(m.get("id") in (1, 4, 5) for m in b.seen)
        a.close()
        b.close()

        c = TcpClient(port)  # after both left: a fresh session on the same server
        c.initialize()
        assert c.text(6, "file:///secret.py")["error"]["code"] == -32602
        c.close()
    finally:
        stop(proc)


def test_13_listeners_bind_localhost_by_default():
    from codespec_lsp.cli import build_parser

    args = build_parser().parse_args(["serve", "--tcp"])
    assert args.host == "127.0.0.1"


def test_14_websocket_refuses_unlisted_browser_origins():
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    proc, port = start("--ws", "--allow-origin", "http://localhost:3000")
    url = f"ws://127.0.0.1:{port}"
    init = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                       "params": {"processId": None, "capabilities": {}}})
    try:
        with pytest.raises(InvalidStatus) as refused:
            connect(url, origin="http://evil.example.com", open_timeout=10)
        assert refused.value.response.status_code == 403
        for origin in (None, "http://localhost:3000"):  # an editor (no Origin); a listed page
            with connect(url, origin=origin, open_timeout=10) as ws:
                ws.send(init)
                while "result" not in (msg := json.loads(ws.recv(10))):
                    pass
                assert msg["id"] == 1
    finally:
        stop(proc)
