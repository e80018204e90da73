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
import functools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import fields
from typing import Any

from codespec_lsp.engine.api import (CancelToken, GenerationResult, document_start_id, end_token_ids,
                                     fim_tokens_of)
from codespec_lsp.completion.heal import Heal, HealVocab, token_texts
from codespec_lsp.remote.client import (ServerClient, ServerInfo, ServerProblem, parse_chunk,
                                        top_logprobs)
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

    def stop(self) -> None:
        async def finish() -> None:
            await self.loop.shutdown_asyncgens()
            self.loop.stop()
        asyncio.run_coroutine_threadsafe(finish(), self.loop)


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
            ids = self._backend.ids_for_text(self._text, text, final=finish is not None)
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


class _ServerDecoder:
    """Just enough of a tokenizer for complete.py's detokenizer, backed by the server."""

    all_special_ids: list[int] = []

    def __init__(self, backend: "RemoteBackend") -> None:
        self._backend = backend

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        try:
            return self._backend.decode(ids)
        except (ServerProblem, concurrent.futures.TimeoutError) as problem:
            if isinstance(problem, ServerProblem):
                self._backend.health.failed(problem)
            return ""


class RemoteBackend:
    """The seam's Backend over a remote server. Build it with `connect_remote` (remote/__init__)."""

    def __init__(self, client: ServerClient, tokenizer: Any = None, *,
                 notify: Notify | None = _log_notify, backoff_s: tuple[float, float] = (0.5, 8.0),
                 tokenizer_loader: Callable[[ServerInfo], Any] | None = None) -> None:
        self.client = client
        self.local_tokenizer = tokenizer   # the HF tokenizer when one is at hand here
        self.health = Health(notify, backoff_s)
        self.loop = LoopThread()
        self._tokenizer_loader = tokenizer_loader
        self._open: dict[str, RemoteGeneration] = {}
        self._last_prompt: dict[str, list[int]] = {}   # key -> ids last sent (insertion = age)
        self._open_lock = threading.Lock()
        self._metrics: dict[str, Any] = {}
        self._metrics_at = 0.0
        self._metrics_future: concurrent.futures.Future | None = None
        self.text_warning_given = False

    # ------------------------------------------------------------ facts

    @property
    def supports_heal(self) -> bool:
        """Token healing (complete.prompt_ids) needs each id's text, so a local tokenizer, and a
        server that takes `allowed_token_ids` (vLLM). Elsewhere the prompt goes unhealed, and a
        suggestion after e.g. a trailing space may differ from the in-process engine's."""
        return self.local_tokenizer is not None and self.kind == "vllm"

    @functools.cached_property
    def heal_vocab(self) -> HealVocab:
        return HealVocab(token_texts(self.local_tokenizer, len(self.local_tokenizer)))

    @property
    def tokenizer(self) -> Any:
        """The local tokenizer, or one that decodes through the server's /detokenize (complete.py
        turns ids into text with `tokenizer.decode`)."""
        return self.local_tokenizer if self.local_tokenizer is not None else _ServerDecoder(self)

    @tokenizer.setter
    def tokenizer(self, value: Any) -> None:
        self.local_tokenizer = value

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
        return int(getattr(self.local_tokenizer, "model_max_length", 0) or 0) if \
            0 < int(getattr(self.local_tokenizer, "model_max_length", 0) or 0) < 10**7 else 2048

    @property
    def stop_ids(self) -> set[int]:
        """Every end id the in-process engine stops at (api.end_token_ids), sent as vLLM's
        stop_token_ids: a server stopping at its EOS only would write past `<|endoftext|>`."""
        if self.local_tokenizer is None:
            return set()
        return end_token_ids(self.local_tokenizer, _generation_eos(self.local_tokenizer))

    @property
    def fim_tokens(self) -> tuple[str, str, str] | None:
        return fim_tokens_of(self.local_tokenizer)

    # ------------------------------------------------------------ tokens

    def count_tokens(self, text: str) -> int:
        if self.local_tokenizer is not None:
            return len(self.local_tokenizer.encode(text, add_special_tokens=False, verbose=False))
        # No tokenizer here: a round trip per count would stall prompt building, so estimate
        # on the high side (code runs 3-4 characters a token) and let the prompt come out short.
        return -(-len(text) // 3)

    def encode(self, text: str) -> list[int]:
        """BOS + ids, as the in-process engine does; the server's /tokenize without a tokenizer."""
        if self.local_tokenizer is not None:
            ids = self.local_tokenizer.encode(text, add_special_tokens=False, verbose=False)
            bos = document_start_id(self.local_tokenizer)  # the in-process engine's start too
        else:
            try:
                ids = self.loop.run(self._tokenize(text), timeout=self.client.deadline_s)
            except ServerProblem as problem:
                self.health.failed(problem)
                return []  # generate() answers an empty prompt with an empty generation
            bos = self._server_bos
        return ([bos] if bos is not None else []) + list(ids)

    _server_bos: int | None | bool = False   # False: not asked yet

    async def _tokenize(self, text: str) -> list[int]:
        if self.client.info is None:
            await self._probe()
        if self._server_bos is False:
            self._server_bos = await self._find_server_bos()
        return await self.client.tokenize(text)

    async def _find_server_bos(self) -> int | None:
        """The BOS the in-process engine would add. The server's tokenizer adds it itself for some
        models; else vLLM's /tokenizer_info (--enable-tokenizer-info-endpoint) names it."""
        plain = await self.client.tokenize("x")
        special = await self.client.tokenize("x", add_special_tokens=True)
        if len(special) == len(plain) + 1 and special[1:] == plain:
            return special[0]
        info = await self.client._optional_json(f"{self.client.root}/tokenizer_info")
        bos = (info or {}).get("bos_token") if isinstance(info, dict) else None
        if isinstance(bos, dict):
            bos = bos.get("content")
        if isinstance(bos, str) and bos:
            ids = await self.client.tokenize(bos)
            if len(ids) == 1:
                return ids[0]
        log.warning("%s: no local tokenizer and the server does not say which BOS its model "
                    "expects: prompts go without one, so suggestions may differ from the "
                    "in-process engine's", self.client.base)
        return None

    def decode(self, ids: Sequence[int]) -> str:
        if self.local_tokenizer is not None:
            return self.local_tokenizer.decode(list(ids), skip_special_tokens=True)
        return self.loop.run(self.client.detokenize(list(ids)), timeout=self.client.deadline_s)

    def ids_for_text(self, before: str, delta: str, final: bool) -> list[int]:
        """For servers that stream text only: the ids of the new text, holding back the last
        token until the text after it is known (it may still merge with what follows)."""
        if not self.text_warning_given:
            self.text_warning_given = True
            log.warning("%s streams text, not token ids: re-tokenized here, so suggestions may "
                        "differ from the in-process engine's", self.client.base)
        if self.local_tokenizer is None:
            return []
        old = self.local_tokenizer.encode(before, add_special_tokens=False) if before else []
        new = self.local_tokenizer.encode(before + delta, add_special_tokens=False)
        stable_old = old if final and not before else old[:-1]
        stable_new = new if final else new[:-1]
        return stable_new[len(stable_old):] if new[:len(stable_old)] == stable_old else []

    # ------------------------------------------------------------ generation

    async def _probe(self) -> ServerInfo:
        info = await self.client.probe()
        if self.local_tokenizer is None and self._tokenizer_loader is not None:
            loader, self._tokenizer_loader = self._tokenizer_loader, None
            self.local_tokenizer = await asyncio.to_thread(loader, info)
        return info

    async def pump(self, request: dict, out: queue.Queue) -> None:
        """Runs on the loop thread: probe once (kind, model), then stream chunks into `out`."""
        try:
            if self.client.info is None:
                await self._probe()
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

    async def _heal(self, request: dict, heal: Heal, out: queue.Queue) -> dict | None:
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

    async def _healing_token(self, request: dict, heal: Heal) -> tuple[int, float] | None:
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
                 lookup_ids: Sequence[int] = (), heal: str = "", words: Iterable[str] = (),
                 copy_weight: float = 0.0) -> RemoteGeneration:
        """`heal`: the answer must start with it (token healing; see _heal). `speculative` and
        `lookup_ids` are the server's business and ignored here, and so is `words` (the lean to
        the document's identifiers, heal.Heal): the server picks every token after the healing
        ones, and vLLM's `logit_bias` cannot follow a word across tokens. `copy_weight` too: the
        copy prior (engine/copy_prior.py) reweighs every step's distribution, which the
        OpenAI-compatible API does not let a client do."""
        ids = self._fit(list(ids), max_new_tokens)
        with self._open_lock:
            previous = self._open.pop(key, None) if key is not None else None
        if previous is not None:
            previous.close()  # never two requests in flight for one document
        request = None
        if ids and not self.health.waiting():  # backing off: an empty answer at once, no network
            request = dict(prompt=ids, max_tokens=max_new_tokens, temperature=temperature,
                           top_p=top_p, seed=seed)
            if heal and self.supports_heal:
                request["heal"] = Heal(self.heal_vocab, heal)
        gen = RemoteGeneration(self, ids, request, cancel, key)
        if key is not None and request is not None:
            with self._open_lock:
                self._open[key] = gen
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
        n = 0
        for a, b in zip(last, ids):
            if a != b:
                break
            n += 1
        return n

    def forget(self, key: str | None, gen: RemoteGeneration) -> None:
        if key is None:
            return
        with self._open_lock:
            if self._open.get(key) is gen:
                del self._open[key]

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
        """backend kind plus the server's rates from its /metrics (refreshed in the background,
        at most every METRICS_EVERY_S; never blocks the caller)."""
        now = time.monotonic()
        if now - self._metrics_at > METRICS_EVERY_S and (
                self._metrics_future is None or self._metrics_future.done()):
            self._metrics_at = now
            self._metrics_future = self.loop.submit(self._refresh_metrics())
        return {"backend": self.kind, "server_acceptance_rate": None,
                "server_prefix_cache_hit_rate": None, **self._metrics}

    def refresh_metrics(self, timeout: float = 5.0) -> dict[str, Any]:
        """Scrape now and wait (benchmarks, tests)."""
        self.loop.run(self._refresh_metrics(), timeout)
        return self.server_stats()

    async def _refresh_metrics(self) -> None:
        text = await self.client.metrics_text()
        if text:
            try:
                self._metrics = server_rates(text)
            except ValueError:
                log.debug("unreadable /metrics from %s", self.client.base)

    def close(self) -> None:
        with self._open_lock:
            open_now = list(self._open.values())
        for gen in open_now:
            gen.close()
        try:
            self.loop.run(self.client.aclose(), timeout=2)
        except Exception:
            pass
        self.loop.stop()


def _generation_eos(tokenizer: Any) -> Any:
    """generation_config.json's eos ids beside a local tokenizer (the target folder), if any."""
    import json
    from pathlib import Path
    path = Path(str(getattr(tokenizer, "name_or_path", "") or "")) / "generation_config.json"
    try:
        return json.loads(path.read_text()).get("eos_token_id") if path.is_file() else None
    except (OSError, ValueError):
        return None
