"""A small OpenAI-compatible server for the remote backend's fast tests (stdlib only, in-process).

It speaks the dialects the client handles: vLLM (`/version`, `token_ids` in the stream, /tokenize,
/metrics), llama-server (`/props`, ids in `logprobs.content`) and a plain OpenAI server (text
only). The tokens are a deterministic function of the prompt, so tests can predict them. It
records every request and counts streams the client closed before their end (`aborted`).
"""

from __future__ import annotations

import json
import select
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

EOS = 2
BOS = 1


def next_tokens(prompt: list[int], n: int) -> list[int]:
    """What the fake model generates for `prompt`: depends on every prompt id (a dropped BOS shows)."""
    seed = sum((i + 1) * t for i, t in enumerate(prompt)) % 997
    return [3 + (seed + 17 * k) % 3000 for k in range(n)]


def fake_tokenize(text: str) -> list[int]:
    return [3 + ord(c) % 3000 for c in text]


@dataclass
class FakeState:
    kind: str = "vllm"                 # vllm | llama-server | openai
    models: list[str] = field(default_factory=lambda: ["fake-model"])
    root: str | None = None
    max_model_len: int = 2048
    mode: str = "ok"                   # ok | hang | status | no_completions | garbage
    status: int = 500
    error_message: str = "internal error"
    token_delay_s: float = 0.0
    eos_after: int | None = None       # emit EOS after this many tokens
    script: list[int] | None = None    # when set, the ids every completion streams (then EOS)
    api_key: str | None = None         # when set, a Bearer key is required
    metrics: str = ""
    # Token healing's one-token requests (not streamed): one with allowed_token_ids gets the first
    # id of `prefer` that is allowed (the model re-typing what was backed up over), else the first
    # allowed; `top` are alternatives sent as top_logprobs when more than one is asked for.
    prefer: list[int] = field(default_factory=list)
    top: dict[int, float] = field(default_factory=dict)
    requests: list[dict] = field(default_factory=list)
    aborted: int = 0
    finished: int = 0
    sent: list[int] = field(default_factory=list)   # tokens sent per completion request
    running: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Handler(BaseHTTPRequestHandler):
    server_version = "fake-openai/1"
    state: FakeState

    def log_message(self, *args) -> None:  # quiet
        pass

    # ---------------------------------------------------------------- plumbing

    def _send_json(self, obj, status: int = 200) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorized(self) -> bool:
        key = self.state.api_key
        if key and self.headers.get("Authorization") != f"Bearer {key}":
            self._send_json({"error": {"message": "invalid api key"}}, 401)
            return False
        return True

    def _body(self) -> dict:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length) or b"{}")

    def _client_gone(self) -> bool:
        try:
            ready, _, _ = select.select([self.connection], [], [], 0)
            return bool(ready) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    # ---------------------------------------------------------------- routes

    def do_GET(self) -> None:
        s = self.state
        s.requests.append({"method": "GET", "path": self.path, "headers": dict(self.headers)})
        if self.path == "/v1/models":
            if not self._authorized():
                return
            self._send_json({"object": "list", "data": [
                {"id": m, "object": "model", "root": s.root or m, "max_model_len": s.max_model_len}
                for m in s.models]})
        elif self.path == "/version" and s.kind == "vllm":
            self._send_json({"version": "0.0-fake"})
        elif self.path == "/props" and s.kind == "llama-server":
            self._send_json({"default_generation_settings": {"n_ctx": s.max_model_len},
                             "total_slots": 1})
        elif self.path == "/metrics" and s.metrics:
            data = s.metrics.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        else:
            self._send_json({"error": {"message": "Not Found"}}, 404)

    def do_POST(self) -> None:
        s = self.state
        body = self._body()
        s.requests.append({"method": "POST", "path": self.path, "headers": dict(self.headers),
                           "body": body})
        if not self._authorized():
            return
        if self.path == "/tokenize":
            text = body.get("prompt", body.get("content", ""))
            special = body.get("add_special_tokens", body.get("add_special", True))
            ids = ([BOS] if special else []) + fake_tokenize(text)
            self._send_json({"tokens": ids, "count": len(ids), "max_model_len": s.max_model_len})
        elif self.path == "/detokenize":
            self._send_json({"prompt": "".join(f"<{t}>" for t in body.get("tokens", []))})
        elif self.path == "/v1/completions":
            self._complete(body)
        else:
            self._send_json({"error": {"message": "Not Found"}}, 404)

    def _complete(self, body: dict) -> None:
        s = self.state
        if s.mode == "no_completions":
            return self._send_json({"detail": "Not Found"}, 404)
        if body.get("model") not in s.models:
            return self._send_json({"error": {"message": f"The model `{body.get('model')}` does "
                                              f"not exist."}}, 404)
        if s.mode == "status":
            return self._send_json({"error": {"message": s.error_message}}, s.status)
        prompt = body["prompt"] if isinstance(body["prompt"], list) else fake_tokenize(body["prompt"])
        n = int(body.get("max_tokens", 16))
        tokens = next_tokens(prompt, n) if s.script is None else (s.script + [EOS])[:n]
        if not body.get("stream"):
            return self._complete_once(body, tokens)
        if s.eos_after is not None and s.eos_after < n:
            tokens = tokens[:s.eos_after] + [EOS]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        with s.lock:
            s.running += 1
        sent = 0
        try:
            for i, tok in enumerate(tokens):
                if s.mode == "hang" and i == 1:
                    while not self._client_gone():
                        time.sleep(0.01)
                    raise BrokenPipeError
                if s.token_delay_s:
                    time.sleep(s.token_delay_s)
                last = i == len(tokens) - 1
                finish = ("stop" if tok == EOS else "length") if last else None
                self._event(self._chunk(tok, finish))
                sent += 1
            if body.get("stream_options", {}).get("include_usage"):
                self._event({"choices": [], "usage": {"prompt_tokens": len(prompt),
                                                      "completion_tokens": sent,
                                                      "prompt_tokens_details": {"cached_tokens": 0}}})
            self._event("[DONE]")
            with s.lock:
                s.finished += 1
        except (BrokenPipeError, ConnectionResetError):
            with s.lock:
                s.aborted += 1
        finally:
            with s.lock:
                s.running -= 1
                s.sent.append(sent)

    def _complete_once(self, body: dict, tokens: list[int]) -> None:
        s = self.state
        allowed = body.get("allowed_token_ids")
        if allowed:
            tokens = [next((t for t in s.prefer if t in allowed), allowed[0])]
        reply = self._chunk(tokens[0], "length")
        if body.get("logprobs", 0) > 1:
            reply["choices"][0]["logprobs"]["top_logprobs"] = [
                {f"token_id:{t}": lp for t, lp in {tokens[0]: -0.5, **s.top}.items()}]
        reply["usage"] = {"prompt_tokens": len(body["prompt"]), "completion_tokens": 1}
        with s.lock:
            s.finished += 1
            s.sent.append(1)
        self._send_json(reply)

    def _chunk(self, tok: int, finish: str | None) -> dict:
        kind = self.state.kind
        choice: dict = {"index": 0, "text": "" if tok == EOS else f"t{tok} ", "finish_reason": finish}
        if kind == "vllm":
            choice["token_ids"] = [tok]
            choice["logprobs"] = {"tokens": [f"token_id:{tok}"], "token_logprobs": [-0.5]}
        elif kind == "llama-server":
            choice["logprobs"] = {"content": [{"id": tok, "token": f"t{tok}", "logprob": -0.25}]}
        return {"id": "cmpl-fake", "object": "text_completion", "choices": [choice]}

    def _event(self, obj) -> None:
        data = obj if isinstance(obj, str) else json.dumps(obj)
        if self.state.mode == "garbage":
            data = "{not json"
        self.wfile.write(f"data: {data}\n\n".encode())
        self.wfile.flush()


class FakeServer:
    """`with FakeServer() as fake: fake.url` — base URL ending in /v1; `stop()`/`start()` to
    simulate an outage on the same port."""

    def __init__(self, state: FakeState | None = None, port: int = 0,
                 tls: tuple[str, str] | None = None) -> None:
        self.state = state or FakeState()
        self.port = port
        self.tls = tls  # (certfile, keyfile): serve HTTPS
        self._httpd: ThreadingHTTPServer | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}/v1"

    def start(self) -> None:
        handler = type("Handler", (_Handler,), {"state": self.state})
        ThreadingHTTPServer.allow_reuse_address = True
        self._httpd = ThreadingHTTPServer(("127.0.0.1", self.port), handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        if self.tls:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*self.tls)
            self._httpd.socket = ctx.wrap_socket(self._httpd.socket, server_side=True)
        threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> "FakeServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def completions(self) -> list[dict]:
        return [r for r in self.state.requests if r["path"] == "/v1/completions"]
