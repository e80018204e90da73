"""The remote backend: the seam's Backend over an OpenAI-compatible server (SEAM.md).

Promises:
- `generate(ids)` sends exactly `ids` (the local tokenizer's, BOS included) and yields the ids the
  server streams back, so a remote greedy suggestion equals the in-process engine's for the same
  target. Where the server sends only text, the text is tokenized here (suggestions may differ).
- Cancel (the token, set from any thread) and `close()` close the HTTP stream at once (within
  POLL_S), and the server aborts the request. One generation in flight per document key: a new
  one for the same key closes the old.
- Failures never raise out of a generation: it ends with stop_reason "error" and no more ids.
  Each kind of failure is told once through `notify` (a window/showMessage upstream), and once
  more when the server is back; while it is down, requests back off (no network call) for a
  growing pause, so keystrokes get empty answers at once and recovery needs no user action.
- All HTTP runs on one event loop thread owned by the backend; the caller's thread only waits
  on a queue.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import fields
from typing import Any

from codespec_lsp.engine.api import CancelToken, GenerationResult, TokenConstraint
from codespec_lsp.remote.client import (ServerClient, ServerInfo, ServerProblem, parse_chunk,
                                        top_logprobs)
from codespec_lsp.remote.ids import RemoteIds
from codespec_lsp.remote.metrics import server_rates

log = logging.getLogger(__name__)

POLL_S = 0.01          # how often a waiting generation looks at its cancel token
RETELL_S = 300.0       # a flapping server: the same trouble is told again only after this
METRICS_EVERY_S = 2.0  # /metrics is scraped at most this often
# vLLM's GPU model runner refuses a request with more allowed_token_ids than this (it raises in
# the engine); a larger set is handled through the top log-probs instead.
MAX_ALLOWED_IDS = 1024
HEAL_TOP_LOGPROBS = 20  # vLLM's default --max-logprobs
Notify = Callable[[str, str], Any]   # (level "error" | "info", message)


def _log_notify(level: str, message: str) -> None:
    (log.warning if level == "error" else log.info)("%s", message)


class LoopThread:
    """An asyncio loop in a daemon thread: httpx's async client lives here, so a stream can be
    closed from any thread by cancelling its task."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="codespec-remote",
                                        daemon=True)
        self._thread.start()

    def submit(self, coro) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro, timeout: float | None = None) -> Any:
        return self.submit(coro).result(timeout)

    def stop(self, timeout: float = 2.0) -> None:
        """Cancel what still runs (streams, a /metrics scrape), let it clean up, then close the
        loop: a task left pending on a stopped loop is "destroyed but pending" when collected."""
        async def finish() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=timeout)
            await self.loop.shutdown_asyncgens()
            self.loop.stop()
        if self.loop.is_closed():
            return
        asyncio.run_coroutine_threadsafe(finish(), self.loop)
        if threading.current_thread() is self._thread:
            return  # called on the loop itself: it stops when this callback returns
        self._thread.join(timeout + 1)
        if not self._thread.is_alive():
            self.loop.close()


class Health:
    """One notice per kind of failure, one when it clears, and back-off while the server is down.
    Without a `notify` yet (the server wires it after loading) notices wait in `unsent`."""

    def __init__(self, notify: Notify | None, backoff_s: tuple[float, float] = (0.5, 8.0),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.notify: Notify | None = notify
        self.unsent: list[tuple[str, str]] = []
        self.condition: str | None = None
        self.message: str | None = None
        self._min, self._max = backoff_s
        self._pause = 0.0
        self._retry_at = 0.0
        self._clock = clock
        self._lock = threading.Lock()
        self._told: dict[str, float] = {}   # condition -> when it was last told
        self._told_now = False              # the current trouble was told (so tell its end)

    def set_notify(self, notify: Notify) -> None:
        self.notify, unsent, self.unsent = notify, self.unsent, []
        for level, message in unsent:
            notify(level, message)

    def _tell(self, level: str, message: str) -> None:
        if self.notify is None:
            self.unsent.append((level, message))
        else:
            self.notify(level, message)

    def waiting(self) -> bool:
        """True while backing off: answer empty without a network call."""
        return self.condition is not None and self._clock() < self._retry_at

    def failed(self, problem: ServerProblem) -> None:
        now = self._clock()
        with self._lock:
            new = problem.condition != self.condition
            self.condition, self.message = problem.condition, problem.message
            self._pause = self._min if new or not self._pause else min(self._pause * 2, self._max)
            self._retry_at = now + self._pause
            told = self._told.get(problem.condition)
            tell = new and (told is None or now - told > RETELL_S)
            if tell:
                self._told[problem.condition], self._told_now = now, True
        if tell:
            self._tell("error", problem.message)
        else:
            log.debug("still failing: %s", problem.message)

    def ok(self, base: str) -> None:
        if self.condition is None:
            return  # the usual case, once per chunk: no lock
        with self._lock:
            was_told, self._told_now = self._told_now, False
            self.condition, self.message, self._pause = None, None, 0.0
        if was_told:
            self._tell("info", f"codespec: {base} answers again")


class ServerMetrics:
    """The server's rates from its /metrics, refreshed in the background at most every
    METRICS_EVERY_S, so asking for them never waits on the network."""

    def __init__(self, client: ServerClient, loop: LoopThread) -> None:
        self._client, self._loop = client, loop
        self._rates: dict[str, Any] = {}
        self._at = 0.0
        self._future: concurrent.futures.Future | None = None

    def rates(self) -> dict[str, Any]:
        now = time.monotonic()
        if now - self._at > METRICS_EVERY_S and (self._future is None or self._future.done()):
            self._at = now
            self._future = self._loop.submit(self._refresh())
        return {"server_acceptance_rate": None, "server_prefix_cache_hit_rate": None, **self._rates}

    def refresh(self, timeout: float) -> None:
        self._loop.run(self._refresh(), timeout)

    async def _refresh(self) -> None:
        text = await self._client.metrics_text()
        if text:
            try:
                self._rates = server_rates(text)
            except ValueError:
                log.debug("unreadable /metrics from %s", self._client.base)


def _result(**counts: Any) -> GenerationResult:
    """A GenerationResult with the seam's fields where this version of api.py has them."""
    names = {f.name for f in fields(GenerationResult)}
    result = GenerationResult(text="", tokens=[], stop_reason="max_tokens", cancelled=False,
                              **{k: v for k, v in counts.items() if k in names})
    if "logprobs" not in names:
        result.logprobs = []  # type: ignore[attr-defined]
    return result


class RemoteGeneration:
    """The seam's Generation: iterate for new ids; `close()` ends it and closes the stream.
    `result` is kept up to date and is final once iteration ends."""

    def __init__(self, backend: "RemoteBackend", ids: list[int], request: dict | None,
                 cancel: CancelToken | None, key: str | None) -> None:
        self.result = _result()
        self._backend = backend
        self._cancel = cancel
        self._key = key
        self._queue: queue.Queue = queue.Queue()
        self._pending: list[tuple[int, float]] = []   # (id, logprob) received, not yet taken
        self._done = request is None
        self._started = time.perf_counter()
        self._text = ""
        self._ended: str | None = None   # the server's finish reason; its stream is read to the end
        self._future: concurrent.futures.Future | None = None
        if request is None:
            self.result.stop_reason = "error"
            return
        # What the server's prefix cache probably holds (the document's last prompt), until its
        # usage chunk says (vLLM with --enable-prompt-tokens-details): the rhythm model and the
        # stats tell a keystroke (few new tokens) from a cold file this way.
        reused = backend.remember_prompt(key, ids)
        self.result.reused_tokens, self.result.prefill_tokens = reused, len(ids) - reused
        self._future = backend.loop.submit(backend.pump(request, self._queue))

    def __iter__(self) -> Iterator[int]:
        return self

    def __next__(self) -> int:
        while True:
            if self._cancel is not None and self._cancel.cancelled:
                if self._pending or not self._done:
                    self._finish("cancelled")
                raise StopIteration
            if self._pending:
                tok, logprob = self._pending.pop(0)
                self.result.tokens.append(tok)   # the result holds what the caller took
                self.result.logprobs.append(logprob)
                return tok
            if self._done:
                raise StopIteration
            self._step()

    def _step(self) -> None:
        try:
            kind, *payload = self._queue.get(timeout=POLL_S)
        except queue.Empty:
            return
        if kind in ("chunk", "end"):
            self._backend.health.ok(self._backend.client.base)  # the server answers
        if kind == "chunk":
            self._on_chunk(*payload)
        elif kind == "usage":
            usage = payload[0]
            details = usage.get("prompt_tokens_details") or {}
            cached = details.get("cached_tokens")
            if cached is not None:
                self.result.reused_tokens = int(cached)
                self.result.prefill_tokens = max(int(usage.get("prompt_tokens", 0)) - int(cached), 0)
        elif kind == "end":
            self._finish(self._ended or payload[0])
        elif kind == "fail":
            if self._ended is None:  # a stream that broke after its last token is not a failure
                self._backend.health.failed(payload[0])
            self._finish(self._ended or "error")

    def _on_chunk(self, ids: list[int] | None, logprobs: list[float], text: str,
                  finish: str | None) -> None:
        if ids is None:  # a text-only server: ids from the local tokenizer, stable part first
            ids = self._backend.ids.ids_for_text(self._text, text, final=finish is not None)
            self._text += text
        stops = self._backend.stop_ids
        kept = [t for t in ids if t not in stops]
        logprobs = logprobs if len(logprobs) >= len(kept) else [0.0] * len(kept)
        self._pending.extend(zip(kept, logprobs))
        if ids:
            self.result.target_forwards += 1  # one streamed chunk = one server step
        # Not finished yet: the usage chunk and [DONE] follow, and reading them lets httpx keep
        # the connection for the next request (a new TLS handshake per keystroke otherwise).
        if finish is not None:
            self._ended = {"length": "max_tokens", "stop": "eos"}.get(finish, finish)
        elif len(kept) < len(ids):
            self._ended = "eos"

    def _finish(self, reason: str) -> None:
        first, self._done = not self._done, True
        if reason == "cancelled":
            self._pending.clear()  # ids received but not taken are dropped
            self.result.cancelled = True
        if not first:
            if reason == "cancelled":
                self.result.stop_reason = reason
            return
        if self._future is not None and not self._future.done():
            self._future.cancel()  # cancels the task: httpx closes the connection, vLLM aborts
        self.result.stop_reason = reason
        self.result.wall_s = time.perf_counter() - self._started
        self._backend.forget(self._key, self)

    def close(self) -> None:
        """The caller stops here (e.g. the block ended): the stream closes, the server stops, and
        the result keeps the ids taken so far with stop_reason "stop" (not a cancel)."""
        if not self._done:
            self._finish("stop" if self._future is not None else "error")
        self._pending.clear()

    def __enter__(self) -> "RemoteGeneration":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        if not self._done and self._future is not None:
            self._future.cancel()


class RemoteBackend:
    """The seam's Backend over a remote server. Build it with `connect_remote` (remote/__init__)."""

    def __init__(self, client: ServerClient, tokenizer: Any = None, *,
                 notify: Notify | None = _log_notify, backoff_s: tuple[float, float] = (0.5, 8.0),
                 tokenizer_loader: Callable[[ServerInfo], Any] | None = None) -> None:
        self.client = client
        self.health = Health(notify, backoff_s)
        self.loop = LoopThread()
        self.ids = RemoteIds(client, self.loop, self.health, tokenizer, tokenizer_loader)
        self._open: set[RemoteGeneration] = set()   # streams still running, for close()
        self._last_prompt: dict[str, list[int]] = {}   # key -> ids last sent (insertion = age)
        self._open_lock = threading.Lock()
        self.metrics = ServerMetrics(client, self.loop)

    # ------------------------------------------------------------ the seam's text and ids (ids.py)

    @property
    def local_tokenizer(self) -> Any:
        return self.ids.local_tokenizer

    @property
    def tokenizer(self) -> Any:
        return self.ids.tokenizer

    @tokenizer.setter
    def tokenizer(self, value: Any) -> None:
        self.ids.local_tokenizer = value

    @property
    def token_texts(self) -> list[str]:
        return self.ids.token_texts

    @property
    def stop_ids(self) -> frozenset[int]:
        return self.ids.stop_ids

    @property
    def fim_tokens(self) -> tuple[str, str, str] | None:
        return self.ids.fim_tokens

    def count_tokens(self, text: str) -> int:
        return self.ids.count_tokens(text)

    def encode(self, text: str) -> list[int]:
        return self.ids.encode(text)

    # ------------------------------------------------------------ facts

    @property
    def supports_heal(self) -> bool:
        """Token healing (complete.prompt_ids) needs each id's text, so a local tokenizer, and a
        server that takes `allowed_token_ids` (vLLM). Elsewhere the prompt goes unhealed, and a
        suggestion after e.g. a trailing space may differ from the in-process engine's."""
        return self.local_tokenizer is not None and self.kind == "vllm"

    @property
    def kind(self) -> str:
        return self.client.info.kind if self.client.info else "openai"

    @property
    def target_name(self) -> str:
        return self.client.model or "?"

    draft_name = None  # the server's speculation is its own business; stats read its /metrics

    @property
    def device(self) -> str:
        return self.client.base

    @property
    def context_window(self) -> int:
        info = self.client.info
        if info is not None and info.context_window:
            return info.context_window
        known = int(getattr(self.local_tokenizer, "model_max_length", 0) or 0)
        return known if 0 < known < 10**7 else 2048  # tokenizers without one say ~1e30

    # ------------------------------------------------------------ generation

    async def pump(self, request: dict, out: queue.Queue) -> None:
        """Runs on the loop thread: probe once (kind, model), then stream chunks into `out`."""
        try:
            if self.client.info is None:
                await self.ids.probe()
            heal = request.pop("heal", None)
            if heal is not None:
                request = await self._heal(request, heal, out)
                if request is None:
                    return
            body = self.client.completion_body(**request, stop_ids=sorted(self.stop_ids))
            # aclosing: a cancel closes the response in this task, at once, not at GC time.
            async with contextlib.aclosing(self.client.stream_completion(body)) as chunks:
                async for chunk in chunks:
                    if chunk.get("usage"):
                        out.put(("usage", chunk["usage"]))
                    if chunk.get("choices"):
                        out.put(("chunk", *parse_chunk(chunk)))
            out.put(("end", "max_tokens"))
        except ServerProblem as problem:
            if problem.condition in ("refused", "unreachable"):
                self.client.info = None  # it may come back as another server: probe again
            out.put(("fail", problem))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug here must cost one empty answer, not the worker
            log.exception("remote generation failed")
            out.put(("fail", ServerProblem("bad_reply", f"codespec: remote generation failed: "
                                           f"{type(exc).__name__}: {exc}")))

    async def _heal(self, request: dict, heal: TokenConstraint, out: queue.Queue) -> dict | None:
        """Token healing on the server: the token(s) re-typing `heal.rest` come one short request
        each (vLLM's prefix cache makes it one cheap forward), then the main request goes on from
        there. None when the generation already ended (nothing re-types it, or no room left)."""
        prompt, left = list(request["prompt"]), request["max_tokens"]
        while heal.rest and left > 0:
            picked = await self._healing_token({**request, "prompt": prompt}, heal)
            if picked is None:
                log.info("no token re-types %r here; no suggestion", heal.rest)
                out.put(("end", "stop"))
                return None
            out.put(("chunk", [picked[0]], [picked[1]], "", None))
            heal.accept([picked[0]])
            prompt.append(picked[0])
            left -= 1
        if left <= 0:
            out.put(("end", "max_tokens"))
            return None
        return {**request, "prompt": prompt, "max_tokens": left}

    async def _healing_token(self, request: dict, heal: TokenConstraint) -> tuple[int, float] | None:
        """(id, logprob) of the next token under the healing constraint, as the in-process engine
        masks it. A small allowed set goes as `allowed_token_ids` (exact, greedy or sampled). A
        large one (a trailing space allows every token that starts with one) is over vLLM's
        limit: the server picks freely, and a pick outside the set is replaced by the most likely
        allowed token among its top log-probs. For greedy that is exactly the constrained argmax;
        for sampling it favours that token a little."""
        mask = heal.allowed(heal.rest)
        allowed = mask.nonzero().flatten().tolist()
        if not allowed:
            return None
        small = len(allowed) <= MAX_ALLOWED_IDS
        body = self.client.completion_body(**{**request, "max_tokens": 1}, stop_ids=[])
        body.update(stream=False, logprobs=1 if small else HEAL_TOP_LOGPROBS)
        body.pop("stream_options", None)
        if small:
            body["allowed_token_ids"] = allowed
        reply = await self.client.complete_once(body)
        ids, logprobs, _, _ = parse_chunk(reply)
        if ids and 0 <= ids[0] < len(mask) and mask[ids[0]]:
            return ids[0], (logprobs or [0.0])[0]
        ranked = sorted(top_logprobs(reply).items(), key=lambda kv: -kv[1])
        return next(((t, lp) for t, lp in ranked if 0 <= t < len(mask) and mask[t]), None)

    def generate(self, ids: list[int], *, max_new_tokens: int = 64, temperature: float = 0.0,
                 top_p: float = 1.0, seed: int | None = None, cancel: CancelToken | None = None,
                 speculative: bool = True, key: str | None = None,
                 lookup_ids: Sequence[int] = (), constraint: TokenConstraint | None = None,
                 copy_weight: float = 0.0) -> RemoteGeneration:
        """`constraint`: token healing, the answer must start with its `rest` (see _heal); only
        its mask is applied, to the healing tokens. `speculative` and `lookup_ids` are the server's
        business and ignored here, and so is the healing's lean to the document's identifiers
        (completion.heal.Heal's `words`): the server picks every token after the healing ones,
        and vLLM's `logit_bias` cannot follow a word across tokens. `copy_weight` too: the
        copy prior (engine/copy_prior.py) reweighs every step's distribution, which the
        OpenAI-compatible API does not let a client do."""
        ids = self._fit(list(ids), max_new_tokens)
        request = None
        if ids and not self.health.waiting():  # backing off: an empty answer at once, no network
            request = dict(prompt=ids, max_tokens=max_new_tokens, temperature=temperature,
                           top_p=top_p, seed=seed)
            if constraint is not None and constraint.rest and self.supports_heal:
                request["heal"] = constraint
        gen = RemoteGeneration(self, ids, request, cancel, key)
        # Whether this request went stale is the caller's to say (lsp/supersede.py sets `cancel`;
        # the stream is closed within POLL_S of it): the backend keeps no supersede of its own.
        if request is not None:
            with self._open_lock:
                self._open.add(gen)
        return gen

    def _fit(self, ids: list[int], max_new_tokens: int) -> list[int]:
        """Keep the first id (BOS) and the tail when prompt + answer would not fit the window."""
        room = self.context_window - max_new_tokens
        if len(ids) <= room or room < 2:
            return ids
        return ids[:1] + ids[len(ids) - room + 1:]

    def remember_prompt(self, key: str | None, ids: list[int]) -> int:
        """Length of the head `ids` shares with the last prompt sent for `key` (then remembers it)."""
        if key is None:
            return 0
        with self._open_lock:
            last = self._last_prompt.pop(key, [])
            self._last_prompt[key] = ids
            while len(self._last_prompt) > 64:  # a bounded memory: the oldest documents go first
                self._last_prompt.pop(next(iter(self._last_prompt)))
        return next((n for n, (a, b) in enumerate(zip(last, ids)) if a != b), min(len(last), len(ids)))

    def forget(self, key: str | None, gen: RemoteGeneration) -> None:
        with self._open_lock:
            self._open.discard(gen)

    def in_flight(self) -> int:
        with self._open_lock:
            return len(self._open)

    def prefill(self, ids: list[int], *, key: str | None = None,
                cancel: CancelToken | None = None) -> GenerationResult:
        """Warm the server's prefix cache: the same prompt with one new token, thrown away."""
        gen = self.generate(ids, max_new_tokens=1, cancel=cancel, key=key)
        for _ in gen:
            pass
        gen.close()
        result = gen.result
        result.tokens, result.logprobs, result.target_forwards = [], [], 0
        return result

    # ------------------------------------------------------------ stats

    def server_stats(self) -> dict[str, Any]:
        """backend kind plus the server's rates from its /metrics (never blocks the caller)."""
        return {"backend": self.kind, **self.metrics.rates()}

    def refresh_metrics(self, timeout: float = 5.0) -> dict[str, Any]:
        """Scrape now and wait (benchmarks, tests)."""
        self.metrics.refresh(timeout)
        return self.server_stats()

    def close(self) -> None:
        with self._open_lock:
            open_now = list(self._open)
        for gen in open_now:
            gen.close()
        try:
            self.loop.run(self.client.aclose(), timeout=2)
        except Exception:
            pass
        self.loop.stop()
