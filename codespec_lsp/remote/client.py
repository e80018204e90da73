"""HTTP to one OpenAI-compatible server (vLLM, llama-server, SGLang, ...): httpx, async, streaming.

Promises:
- Every network failure comes out as a `ServerProblem` whose `condition` names the kind of failure
  (one pop-up per kind, see backend.Health) and whose message says what to do. The API key never
  appears in a message or a log line.
- Connect timeout CONNECT_TIMEOUT_S (2 s), a failed connect tried once more at once; a stream
  that sends nothing for `read_timeout_s`, or runs past `deadline_s` in all, is cut.
- `stream_completion` is an async generator: closing it (or cancelling the task that iterates it)
  closes the HTTP connection, which is how vLLM learns to abort the request.
- The server kind is detected once (vLLM answers `/version`, llama-server `/props`) only to add
  what that server understands: token ids in the stream (vLLM), `cache_prompt` (llama-server).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 2.0
CONNECT_RETRIES = 1     # a failed connect is tried once more, at once, before it is a problem
READ_TIMEOUT_S = 10.0   # silence between two chunks (a long prefill on a busy server included)
DEADLINE_S = 30.0       # a whole completion; editor suggestions are a few dozen tokens


class ServerProblem(Exception):
    """condition: refused | unreachable | auth | model | no_completions | http | hung | bad_reply."""

    def __init__(self, condition: str, message: str) -> None:
        super().__init__(message)
        self.condition = condition
        self.message = message


@dataclass
class ServerInfo:
    kind: str                       # "vllm" | "llama-server" | "openai"
    model: str                      # the name sent as "model"
    served: list[str] = field(default_factory=list)
    root: str | None = None         # where the server loaded the model from (vLLM: a path or hub id)
    context_window: int | None = None
    version: str | None = None


def normalize_url(url: str) -> str:
    """The OpenAI-compatible base without a trailing slash; a bare host gets `/v1`."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"remote {url!r} is not an http(s) URL; give the OpenAI-compatible base, "
                         f"e.g. http://127.0.0.1:8000/v1")
    base = url.strip().rstrip("/")
    return base if parts.path.rstrip("/") else base + "/v1"


def is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    return host in ("localhost", "::1") or host.startswith("127.")


class ServerClient:
    """One server: its base URL, model, key and timeouts; probe, tokenize, stream, metrics."""

    def __init__(self, url: str, model: str | None = None, api_key: str | None = None, *,
                 connect_timeout_s: float = CONNECT_TIMEOUT_S, read_timeout_s: float = READ_TIMEOUT_S,
                 deadline_s: float = DEADLINE_S) -> None:
        self.base = normalize_url(url)
        self.root = self.base[:-3] if self.base.endswith("/v1") else self.base
        self.wanted_model = model
        self.deadline_s = deadline_s
        self._secret = api_key or None
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # trust_env: proxies and SSL_CERT_FILE (a team's own CA for HTTPS) come from the environment.
        # One connect retry: a connect that timed out once, on a busy machine (CI, 2 cores, vLLM on
        # CPU), must not put every keystroke into the back-off meant for a server that is down.
        transport = httpx.AsyncHTTPTransport(
            trust_env=True, retries=CONNECT_RETRIES,
            limits=httpx.Limits(max_keepalive_connections=8, keepalive_expiry=30))
        self._http = httpx.AsyncClient(
            headers=headers, trust_env=True, transport=transport,
            timeout=httpx.Timeout(read_timeout_s, connect=min(connect_timeout_s, CONNECT_TIMEOUT_S)))
        self.info: ServerInfo | None = None

    def __repr__(self) -> str:  # never the headers: they hold the key
        return f"ServerClient({self.base!r}, model={self.wanted_model!r})"

    async def aclose(self) -> None:
        await self._http.aclose()

    # ------------------------------------------------------------ errors

    def _clean(self, text: str) -> str:
        return text.replace(self._secret, "***") if self._secret else text

    def _connect_problem(self, exc: Exception, what: str) -> ServerProblem:
        if isinstance(exc, httpx.ConnectTimeout):
            return ServerProblem("unreachable", f"codespec: no answer from {self.base} within "
                                 f"{CONNECT_TIMEOUT_S:.0f} s ({what}); retrying in the background")
        reason = str(exc) or type(exc).__name__
        if _caused_by(exc, ConnectionRefusedError) or "refused" in reason.lower():
            return ServerProblem("refused", f"codespec: {self.base} refused the connection (is the "
                                 f"server running?); retrying in the background")
        return ServerProblem("unreachable", self._clean(
            f"codespec: cannot reach {self.base} ({what}: {reason}); retrying in the background"))

    def _status_problem(self, response: httpx.Response, body: str, what: str) -> ServerProblem:
        code = response.status_code
        detail = _error_text(body)
        if code in (401, 403):
            return ServerProblem("auth", f"codespec: {self.base} refused the request (HTTP {code}): "
                                 f"check the API key in the variable named by apiKeyEnv")
        if code in (404, 405) and what == "completions":
            if "model" in detail.lower():
                return ServerProblem("model", self._clean(
                    f"codespec: {self.base} does not serve model {self.model!r}: {detail}"))
            return ServerProblem("no_completions", f"codespec: {self.base} has no /v1/completions "
                                 f"(HTTP {code}): give the OpenAI-compatible base, e.g. http://host:8000/v1")
        if code == 404 and what == "models":
            return ServerProblem("no_completions", f"codespec: {self.base} is not an OpenAI-compatible "
                                 f"base (GET /models: HTTP 404): give the URL that ends in /v1")
        return ServerProblem("http", self._clean(
            f"codespec: {self.base} answered HTTP {code} to {what}: {detail[:300]}"))

    async def _request(self, method: str, url: str, what: str, **kwargs: Any) -> httpx.Response:
        try:
            return await self._http.request(method, url, **kwargs)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise self._connect_problem(exc, what) from None
        except httpx.TimeoutException:
            raise ServerProblem("hung", f"codespec: {self.base} did not answer {what} in time") from None
        except httpx.HTTPError as exc:
            raise ServerProblem("unreachable", self._clean(
                f"codespec: {what} to {self.base} failed: {type(exc).__name__}: {exc}")) from None

    async def _json(self, method: str, url: str, what: str, **kwargs: Any) -> Any:
        response = await self._request(method, url, what, **kwargs)
        if response.status_code >= 400:
            raise self._status_problem(response, response.text, what)
        try:
            return response.json()
        except ValueError:
            raise ServerProblem("bad_reply", f"codespec: {self.base} sent no JSON for {what}") from None

    # ------------------------------------------------------------ probe

    @property
    def model(self) -> str | None:
        return self.info.model if self.info else self.wanted_model

    async def probe(self) -> ServerInfo:
        """GET /v1/models (the model, its context), then the kind: /version, else /props."""
        data = await self._json("GET", f"{self.base}/models", "models")
        models = [m for m in (data.get("data") or []) if isinstance(m, dict) and m.get("id")]
        served = [m["id"] for m in models]
        if self.wanted_model is not None and self.wanted_model not in served:
            raise ServerProblem("model", f"codespec: {self.base} does not serve {self.wanted_model!r}; "
                                f"it serves: {', '.join(served) or 'nothing'}")
        if not served:
            raise ServerProblem("model", f"codespec: {self.base} serves no model yet")
        entry = next(m for m in models if m["id"] == (self.wanted_model or served[0]))
        if self.wanted_model is None and len(served) > 1:
            log.info("%s serves %s; using %s (set remoteModel to choose)", self.base, served, entry["id"])
        info = ServerInfo("openai", entry["id"], served, root=entry.get("root"),
                          context_window=_int(entry.get("max_model_len")))
        version = await self._optional_json(f"{self.root}/version")
        if isinstance(version, dict) and "version" in version:
            info.kind, info.version = "vllm", str(version["version"])
        else:
            props = await self._optional_json(f"{self.root}/props")
            if isinstance(props, dict) and ("default_generation_settings" in props
                                            or "total_slots" in props):
                info.kind = "llama-server"
                settings = props.get("default_generation_settings") or {}
                info.context_window = info.context_window or _int(settings.get("n_ctx"))
        self.info = info
        return info

    async def _optional_json(self, url: str) -> Any:
        try:
            response = await self._http.get(url)
            return response.json() if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None

    # ------------------------------------------------------------ tokens

    async def tokenize(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """The server's own tokenizer, by default without special tokens (the caller adds BOS)."""
        if self.info is not None and self.info.kind == "llama-server":
            data = await self._json("POST", f"{self.root}/tokenize", "tokenize",
                                    json={"content": text, "add_special": add_special_tokens})
        else:
            data = await self._json("POST", f"{self.root}/tokenize", "tokenize",
                                    json={"model": self.model, "prompt": text,
                                          "add_special_tokens": add_special_tokens})
        return [int(t if not isinstance(t, dict) else t["id"]) for t in data["tokens"]]

    async def detokenize(self, ids: list[int]) -> str:
        data = await self._json("POST", f"{self.root}/detokenize", "detokenize",
                                json={"model": self.model, "tokens": list(ids)})
        return data.get("prompt", data.get("content", ""))

    # ------------------------------------------------------------ completions

    def completion_body(self, prompt: list[int] | str, *, max_tokens: int, temperature: float,
                        top_p: float, seed: int | None, stop_ids: list[int]) -> dict:
        body: dict[str, Any] = {
            "model": self.model, "prompt": prompt, "max_tokens": max_tokens,
            "temperature": temperature, "top_p": top_p, "stream": True, "logprobs": 1,
            "stream_options": {"include_usage": True},
        }
        if seed is not None:
            body["seed"] = seed
        kind = self.info.kind if self.info else "openai"
        if kind == "vllm":
            body.update(return_token_ids=True, return_tokens_as_token_ids=True,
                        skip_special_tokens=False)
            if stop_ids:
                body["stop_token_ids"] = stop_ids
        elif kind == "llama-server":
            body.update(cache_prompt=True, return_tokens=True)
        return body

    async def stream_completion(self, body: dict) -> AsyncIterator[dict]:
        """Yields each parsed SSE chunk; raises ServerProblem. Leaving the loop early closes the
        connection (httpx cannot reuse a half-read response), and the server aborts."""
        started = time.monotonic()
        try:
            async with self._http.stream("POST", f"{self.base}/completions", json=body) as response:
                if response.status_code >= 400:
                    text = (await response.aread()).decode("utf-8", "replace")
                    raise self._status_problem(response, text, "completions")
                async for line in response.aiter_lines():
                    if time.monotonic() - started > self.deadline_s:
                        raise ServerProblem("hung", f"codespec: a completion from {self.base} ran "
                                            f"past {self.deadline_s:.0f} s and was cut")
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        return
                    try:
                        chunk = json.loads(data)
                    except ValueError:
                        raise ServerProblem("bad_reply", f"codespec: {self.base} sent a stream "
                                            f"chunk that is not JSON") from None
                    if "error" in chunk and not chunk.get("choices"):
                        raise ServerProblem("http", self._clean(
                            f"codespec: {self.base} failed mid-stream: {_error_text(data)}"))
                    yield chunk
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise self._connect_problem(exc, "completions") from None
        except httpx.ReadTimeout:
            raise ServerProblem("hung", f"codespec: {self.base} sent nothing for "
                                f"{self._http.timeout.read:.0f} s; the completion was cut") from None
        except httpx.HTTPError as exc:
            raise ServerProblem("unreachable", self._clean(
                f"codespec: the stream from {self.base} broke: {type(exc).__name__}: {exc}")) from None

    async def complete_once(self, body: dict) -> dict:
        """One non-streamed completion (token healing's one-token requests)."""
        return await self._json("POST", f"{self.base}/completions", "completions", json=body)

    # ------------------------------------------------------------ metrics

    async def metrics_text(self) -> str | None:
        """Prometheus text from /metrics, or None (llama-server serves it only with --metrics)."""
        try:
            response = await self._http.get(f"{self.root}/metrics")
        except httpx.HTTPError:
            return None
        return response.text if response.status_code == 200 else None


def parse_chunk(chunk: dict) -> tuple[list[int] | None, list[float], str, str | None]:
    """(new token ids or None when the server sent only text, their logprobs, text, finish reason)
    from one streamed chunk, whatever the server's dialect."""
    choices = chunk.get("choices") or []
    if not choices:
        return [], [], "", None
    choice = choices[0]
    text = choice.get("text") or ""
    logprobs = choice.get("logprobs") or {}
    ids = choice.get("token_ids")           # vLLM with return_token_ids
    values: list[float] = []
    if isinstance(logprobs, dict):
        tokens = logprobs.get("tokens")
        if ids is None and tokens and all(str(t).startswith("token_id:") for t in tokens):
            ids = [int(str(t)[9:]) for t in tokens]   # vLLM with return_tokens_as_token_ids
        values = [float(v) for v in (logprobs.get("token_logprobs") or []) if v is not None]
        content = logprobs.get("content")     # llama-server: [{id, token, logprob, ...}]
        if isinstance(content, list) and content:
            if ids is None and all(isinstance(c, dict) and "id" in c for c in content):
                ids = [int(c["id"]) for c in content]
            values = values or [float(c.get("logprob", 0.0)) for c in content if isinstance(c, dict)]
    if ids is None and isinstance(choice.get("tokens"), list):
        ids = [int(t) for t in choice["tokens"]]     # llama-server with return_tokens
    return (list(ids) if ids is not None else None), values, text, choice.get("finish_reason")


def top_logprobs(reply: dict) -> dict[int, float]:
    """{id: logprob} of the alternatives for the first token of a vLLM reply made with
    return_tokens_as_token_ids (keys read "token_id:123"); {} when there are none."""
    choices = reply.get("choices") or [{}]
    tops = ((choices[0].get("logprobs") or {}).get("top_logprobs") or [None])[0] or {}
    return {int(k[9:]): float(v) for k, v in tops.items()
            if str(k).startswith("token_id:") and v is not None}


def _caused_by(exc: BaseException, kind: type) -> bool:
    """anyio wraps the OS error ("All connection attempts failed"): look down the chain."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, kind):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _error_text(body: str) -> str:
    try:
        data = json.loads(body)
    except ValueError:
        return body.strip()[:300]
    err = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(err, dict):
        return str(err.get("message") or err.get("detail") or err)[:300]
    return str(err)[:300]


def _int(value: Any) -> int | None:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None
