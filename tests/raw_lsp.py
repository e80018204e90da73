"""A raw JSON-RPC client over a server's stdio: bytes in as they are, messages out.

For tests that must send what no well-behaved client library would (bad framing, bad
payloads, lifecycle mistakes) and still read every answer.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

FAKE_SERVER = [sys.executable, str(Path(__file__).with_name("fake_engine.py"))]


class RawServer:
    def __init__(self, command: list[str] | None = None, env: dict | None = None) -> None:
        self.proc = subprocess.Popen(command or FAKE_SERVER, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        self.inbox: queue.Queue[dict | None] = queue.Queue()
        self.notifications: list[dict] = []
        self.responses: dict[Any, dict] = {}
        self.stderr: list[bytes] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    # ------------------------------------------------------------------ out

    def write(self, data: bytes) -> None:
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def send(self, message: dict | bytes) -> None:
        body = message if isinstance(message, bytes) else json.dumps(message).encode()
        self.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)

    def notify(self, method: str, params: Any = None) -> None:
        self.send({"jsonrpc": "2.0", "method": method, "params": params})

    def request(self, msg_id: Any, method: str, params: Any = None, timeout: float = 10) -> dict:
        self.send({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params})
        return self.response(msg_id, timeout)

    def initialize(self, options: dict | None = None) -> dict:
        result = self.request("init", "initialize", {
            "processId": None, "rootUri": None, "capabilities": {},
            "initializationOptions": options or {"debounceMs": 0, "maxTokens": 8}}, 60)
        self.notify("initialized", {})
        return result

    def open(self, uri: str, text: str, version: int = 1) -> None:
        self.notify("textDocument/didOpen", {"textDocument": {
            "uri": uri, "languageId": "python", "version": version, "text": text}})

    def change(self, uri: str, version: int, *changes: dict) -> None:
        self.notify("textDocument/didChange", {
            "textDocument": {"uri": uri, "version": version}, "contentChanges": list(changes)})

    def text(self, uri: str, msg_id: Any = None, timeout: float = 10) -> str:
        msg_id = msg_id or f"text-{time.monotonic_ns()}"
        return self.request(msg_id, "codespec/documentText", {"textDocument": {"uri": uri}},
                            timeout)["result"]["text"]

    # ------------------------------------------------------------------ in

    def response(self, msg_id: Any, timeout: float = 10) -> dict:
        deadline = time.monotonic() + timeout
        while msg_id not in self.responses:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no answer to {msg_id!r} in {timeout} s; stderr:\n"
                                   + b"".join(self.stderr).decode(errors="replace")[-3000:])
            try:
                msg = self.inbox.get(timeout=left)
            except queue.Empty:
                continue
            if msg is None:
                raise EOFError("the server closed its output; stderr:\n"
                               + b"".join(self.stderr).decode(errors="replace")[-3000:])
            self._file(msg)
        return self.responses.pop(msg_id)

    def drain(self, wait: float = 0.3) -> None:
        """Take in whatever arrives within `wait` seconds."""
        deadline = time.monotonic() + wait
        while (left := deadline - time.monotonic()) > 0:
            try:
                msg = self.inbox.get(timeout=left)
            except queue.Empty:
                return
            if msg is None:
                return
            self._file(msg)

    def _file(self, msg: dict) -> None:
        if "method" in msg:
            self.notifications.append(msg)
            if "id" in msg:  # a request from the server (progress): answer it
                self.send({"jsonrpc": "2.0", "id": msg["id"], "result": None})
        else:
            self.responses[msg.get("id")] = msg

    def messages_shown(self) -> list[dict]:
        return [n["params"] for n in self.notifications if n["method"] == "window/showMessage"]

    def _read(self) -> None:
        out = self.proc.stdout
        while True:
            length = None
            while True:
                line = out.readline()
                if not line:
                    self.inbox.put(None)
                    return
                if not line.strip():
                    break
                name, _, value = line.decode().partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if length is None:
                continue
            self.inbox.put(json.loads(out.read(length)))

    def _read_stderr(self) -> None:
        for line in self.proc.stderr:
            self.stderr.append(line)

    # ------------------------------------------------------------------ end

    def close(self) -> int:
        """Exit code, killing the process if it does not end."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            return self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()
