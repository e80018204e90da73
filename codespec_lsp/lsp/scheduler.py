"""What runs when: the single engine worker, supersede/cancel, debounce, and the typing-through
cache. Plain asyncio objects, testable without an LSP client. Loading is engine_host.py's job.

Promises:
- One engine worker thread: the engine is not thread-safe, and one model pair saturates the
  accelerator anyway. Prompt building also runs there, since it uses the engine's tokenizer.
- The newest request for a document wins: an older one still debouncing, queued or generating
  has its CancelToken set and answers "superseded" at once; the engine stops within one forward.
- A cancelled request ($/cancelRequest → asyncio cancellation) sets the engine's token too.
- Typing through a shown suggestion, or asking again at the same place, answers from memory
  with no model call.
- The debounce and the suggestion length follow the typing rhythm (Rhythm), so generations
  end before the next keystroke or wait for a pause, and the prompt cache is kept warm.
- Every target forward is accounted exactly once as used (its answer was delivered) or wasted.
- Every request is counted exactly once by its outcome: requests = answered + cancelled +
  superseded + not_ready + disabled + errors (once none is in flight).
- A fault in one request (bad text, an engine error) costs that request an empty answer, never
  the worker or another document.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Sequence

from cachetools import LRUCache

from codespec_lsp.config import Settings, default_context_tokens
from codespec_lsp.completion.context import ContextBuilder
from codespec_lsp.engine.api import CancelToken, GenerationResult
from codespec_lsp.lsp.host import EngineHost
from codespec_lsp.completion.rhythm import Rhythm
from codespec_lsp.stats import percentile
from codespec_lsp.completion.complete import complete_at, prefill_at, split_line  # noqa: F401 - split_line re-exported

log = logging.getLogger(__name__)

PREFIX_KEY_CHARS = 4096   # text before the cursor that identifies a cached suggestion
SUFFIX_KEY_CHARS = 512
_CLOSERS = ")]}\"'`"     # what editors insert right of the cursor when an opener is typed


# ---------------------------------------------------------------- debounce


class Debouncer:
    """Keyed debounce: `wait(key, s)` is True once `s` passed with no newer `wait` for `key`,
    and False at once when a newer one arrives. `sleep` is injectable for a fake clock."""

    def __init__(self, sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep) -> None:
        self._sleep = sleep
        self._waiters: dict[str, asyncio.Future] = {}

    def supersede(self, key: str) -> None:
        prev = self._waiters.pop(key, None)
        if prev is not None and not prev.done():
            prev.set_result(False)

    async def wait(self, key: str, delay_s: float) -> bool:
        self.supersede(key)
        if delay_s <= 0:
            return True
        fut = asyncio.get_running_loop().create_future()
        self._waiters[key] = fut
        sleeper = asyncio.ensure_future(self._sleep(delay_s))
        sleeper.add_done_callback(lambda _: fut.done() or fut.set_result(True))
        try:
            return await fut
        finally:
            sleeper.cancel()
            if self._waiters.get(key) is fut:
                del self._waiters[key]


# ---------------------------------------------------------------- typing-through cache


@dataclass(frozen=True)
class _Entry:
    offset: int
    text: str


class CompletionCache:
    """Recent suggestions keyed by (document, text before the cursor, text after it).

    A repeat of the same place is one dict lookup. Typing through: the newest few entries of the
    document are checked for "the user typed the start of this suggestion since"; the keys
    hash a bounded window of text, so a 1 MB document costs what a small one does.
    """

    def __init__(self, maxsize: int = 256, per_document: int = 8) -> None:
        self._lru: LRUCache = LRUCache(maxsize)
        self._recent: dict[str, deque] = {}
        self._per_document = per_document

    @staticmethod
    def _key(uri: str, source: str, offset: int) -> tuple:
        return (uri, hash(source[max(0, offset - PREFIX_KEY_CHARS):offset]),
                hash(source[offset:offset + SUFFIX_KEY_CHARS]))

    def put(self, uri: str, source: str, offset: int, text: str) -> None:
        key = self._key(uri, source, offset)
        self._lru[key] = _Entry(offset, text)
        recent = self._recent.setdefault(uri, deque(maxlen=self._per_document))
        if key in recent:
            recent.remove(key)
        recent.append(key)

    def get(self, uri: str, source: str, offset: int) -> tuple[str, str] | None:
        """(text, "repeat" | "typing_through") or None."""
        key = self._key(uri, source, offset)
        if (hit := self._lru.get(key)) is not None:
            return hit.text, "repeat"
        # Typing `(` or `"` through a suggestion makes most editors insert the closer too, so
        # the text right of the cursor may have grown by closers: suffix hashes past each of them.
        right = source[offset:offset + 8]
        run = len(right) - len(right.lstrip(_CLOSERS))
        suffix_hashes = {hash(source[offset + k:offset + k + SUFFIX_KEY_CHARS]): k
                         for k in range(run, -1, -1)}
        for old in reversed(self._recent.get(uri, ())):
            entry = self._lru.get(old)
            if entry is None or not entry.text or entry.offset >= offset:
                continue
            if (closers := suffix_hashes.get(old[2])) is None:
                continue
            typed = source[entry.offset:offset]
            if len(typed) >= len(entry.text) or not entry.text.startswith(typed):
                continue
            if hash(source[max(0, entry.offset - PREFIX_KEY_CHARS):entry.offset]) != old[1]:
                continue
            rest = entry.text[len(typed):]
            if closers:
                # Only when the rest, on this line, ends with those very closers: then it stops
                # before them and accepting it leaves exactly the suggested text.
                auto = source[offset:offset + closers]
                if "\n" in rest or not rest.endswith(auto) or len(rest) == closers:
                    continue
                rest = rest[:-closers]
            return rest, "typing_through"
        return None

    def forget(self, uri: str) -> None:
        for key in self._recent.pop(uri, ()):
            self._lru.pop(key, None)


# ---------------------------------------------------------------- stats


def backend_stats(engine: Any) -> dict:
    """`backend` and the server's own rates (remote backends read them off its /metrics)."""
    out = {"backend": "local", "server_acceptance_rate": None, "server_prefix_cache_hit_rate": None}
    if callable(server_stats := getattr(engine, "server_stats", None)):
        stats = server_stats()
        out.update({k: stats.get(k) for k in out})
    return out


# Outcome status -> the Stats counter it increments (each request exactly one).
_COUNTER = {"answered": "answered", "repeat": "answered", "typing_through": "answered",
            "superseded": "superseded", "cancelled": "cancelled", "not_ready": "not_ready",
            "disabled": "disabled", "error": "errors"}
_ANSWERS = ("answered", "repeat", "typing_through")


@dataclass
class Stats:
    requests: int = 0
    answered: int = 0             # got a real answer: the model's, or one from memory
    cancelled: int = 0            # the client cancelled it ($/cancelRequest)
    superseded: int = 0           # a newer request for the document overtook it
    not_ready: int = 0            # no model loaded yet (or the load failed)
    disabled: int = 0             # `enable` is off
    errors: int = 0               # the prompt or the engine failed
    repeats: int = 0              # of answered: the same place asked again, from memory
    typing_through_hits: int = 0  # of answered: the user typed the start of a suggestion
    cache_reused_tokens: int = 0
    prefill_tokens: int = 0
    proposed: int = 0
    accepted: int = 0
    generated_tokens: int = 0
    target_forwards: int = 0
    wasted_target_forwards: int = 0
    shown: int = 0
    accepted_suggestions: int = 0
    partially_accepted: int = 0
    latencies_ms: deque = field(default_factory=lambda: deque(maxlen=2000))

    def percentile(self, q: float) -> float:
        return round(percentile(self.latencies_ms, q), 2)


@dataclass
class CompletionRequest:
    key: str                                      # document uri
    source: str                                   # snapshot of the document text
    offset: int                                   # cursor, in code points
    others: Sequence[tuple[str, str]] = ()        # (uri, text) of other open documents
    roots: Sequence[str] = ()                     # workspace folder URIs, for workspace context
    request_id: Any = None                        # the LSP request id, for the log line
    position: tuple[int, int] | None = None       # (line, character) as the client sent it


@dataclass
class Outcome:
    text: str | None
    status: str   # answered|repeat|typing_through|superseded|cancelled|not_ready|disabled|error
    id: str | None = None
    result: GenerationResult | None = None


@dataclass(eq=False)
class _Job:
    cancel: CancelToken = field(default_factory=CancelToken)
    superseded: asyncio.Event = field(default_factory=asyncio.Event)
    future: asyncio.Future | None = None
    abandoned: bool = False
    accounted: bool = False


def _clean(text: str) -> str:
    """Text the tokenizer accepts: a lone surrogate (an editor can send one) becomes "?", one
    code point for one, so offsets still hold. Checked, not always replaced: encoding is cheap,
    copying every open document on every keystroke is not."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")


# ---------------------------------------------------------------- scheduler


class Scheduler:
    def __init__(self, host: EngineHost, settings: Callable[[], Settings], *,
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
                 clock: Callable[[], float] = time.perf_counter,
                 executor: concurrent.futures.Executor | None = None) -> None:
        """`executor`: the engine's one thread; sessions of one TCP/WebSocket server share one
        (the engine is not thread-safe), a stdio server owns its own."""
        self.host = host
        self.settings = settings
        self.stats = Stats()
        self.cache = CompletionCache()
        self.debouncer = Debouncer(sleep)
        self.rhythm = Rhythm()
        self._calibrated: weakref.ref | None = None
        self._clock = clock
        self._executor = executor or concurrent.futures.ThreadPoolExecutor(1, "codespec-engine")
        self._jobs: dict[str, _Job] = {}
        self._builder: tuple | None = None
        self._ids = itertools.count(1)
        self._shown: LRUCache = LRUCache(512)
        self._errors_logged: set[str] = set()

    def close(self) -> None:
        for job in list(self._jobs.values()):
            job.cancel.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)

    def forget(self, key: str) -> None:
        self.cache.forget(key)
        self._supersede(key)
        if self._builder is not None:
            self._builder[1].forget(key)

    def _supersede(self, key: str) -> None:
        self.debouncer.supersede(key)
        if (job := self._jobs.pop(key, None)) is not None:
            job.cancel.cancel()
            job.superseded.set()

    def count_cancelled_unstarted(self) -> None:
        """A request the client cancelled before its handler ran (the protocol layer sees it):
        counted here, so the outcomes still add up to the requests."""
        self.stats.requests += 1
        self.stats.cancelled += 1

    async def complete(self, req: CompletionRequest) -> Outcome:
        t0 = self._clock()
        self.stats.requests += 1
        self.rhythm.keystroke(t0)
        try:
            outcome = await self._complete(req, t0)
        except asyncio.CancelledError:
            self._finish(req, Outcome(None, "cancelled"), t0)
            raise
        except Exception as exc:  # a bug of ours: one empty answer, and the server goes on
            self._log_fault(exc)
            outcome = Outcome(None, "error")
        return self._finish(req, outcome, t0)

    async def _complete(self, req: CompletionRequest, t0: float) -> Outcome:
        settings = self.settings()
        if not settings.enable:
            self._supersede(req.key)
            return Outcome(None, "disabled")
        if (hit := self.cache.get(req.key, req.source, req.offset)) is not None:
            self._supersede(req.key)  # the user moved on: older work for this document is moot
            return Outcome(hit[0] or None, hit[1])
        engine = self.host.engine
        if engine is None:
            return Outcome(None, "not_ready")
        self._calibrate(engine)
        self._supersede(req.key)
        job = self._jobs[req.key] = _Job()
        try:
            max_tokens = await self._wait_for_turn(job, req, settings, engine, t0)
            if max_tokens is None:
                return self._abandon(job, "superseded")
            return await self._generate(job, req, settings, engine, max_tokens)
        except asyncio.CancelledError:
            self._abandon(job, "cancelled")
            raise
        finally:
            if self._jobs.get(req.key) is job:
                del self._jobs[req.key]

    def _calibrate(self, engine: Any) -> None:
        """The load's warm generation teaches the rhythm once per engine."""
        if self._calibrated is None or self._calibrated() is not engine:
            self._calibrated = weakref.ref(engine)  # weak: a reload must free the old engine
            if self.host.warmup is not None:
                tokens, wall_s, prefill = self.host.warmup
                self.rhythm.generated(wall_s, tokens, prefill)

    async def _wait_for_turn(self, job: _Job, req: CompletionRequest, settings: Settings,
                             engine: Any, t0: float) -> int | None:
        """Debounce (stretched by the rhythm); the max tokens to generate, or None if a newer
        request overtook this one meanwhile."""
        base = settings.debounce_ms / 1000
        delay, max_tokens = self.rhythm.plan(base, settings.max_tokens)
        if delay > base:
            # Typing faster than the model answers: no generation until a pause, but keep the
            # KV cache level with the typing (a few tokens a keystroke), so the answer at
            # the pause prefills almost nothing. Prefill is never waste: the next prompt
            # reuses it.
            if not await self.debouncer.wait(req.key, base):
                return None
            warm = asyncio.get_running_loop().run_in_executor(
                self._executor, self._warm, engine, job, req, settings)
            await self._until_superseded(job, warm)
            delay = max(0.0, delay - (self._clock() - t0))
        if job.superseded.is_set() or not await self.debouncer.wait(req.key, delay):
            return None
        return None if job.superseded.is_set() else max_tokens

    async def _generate(self, job: _Job, req: CompletionRequest, settings: Settings,
                        engine: Any, max_tokens: int) -> Outcome:
        job.future = asyncio.get_running_loop().run_in_executor(
            self._executor, self._run, engine, job, req, settings, max_tokens)
        # An overtaken generation is accounted (as waste) when it really ends.
        job.future.add_done_callback(lambda f: job.abandoned and self._account(job))
        await self._until_superseded(job, job.future)
        if not job.future.done():  # a finished answer is delivered even if just overtaken
            return self._abandon(job, "superseded")
        self._account(job)
        if (exc := job.future.exception()) is not None:
            self._log_fault(exc)
            return Outcome(None, "error")
        result, text = job.future.result()
        if result is None or result.cancelled:
            return Outcome(None, "superseded", result=result)
        if result.stop_reason == "error":  # e.g. the server is down: ask again next time
            return Outcome(None, "error", result=result)
        self.cache.put(req.key, req.source, req.offset, text or "")
        return Outcome(text, "answered", result=result)

    def _log_fault(self, exc: BaseException) -> None:
        # An engine bug must cost one empty answer, not the server, nor a traceback a keystroke.
        what = f"{type(exc).__name__}: {exc}"
        if what in self._errors_logged:
            log.debug("generation failed again: %s", what)
            return
        if len(self._errors_logged) < 64:
            self._errors_logged.add(what)
        log.error("generation failed: %s", what, exc_info=exc)

    def _finish(self, req: CompletionRequest, outcome: Outcome, t0: float) -> Outcome:
        """All of a request's accounting, in one place, whatever way it ended."""
        ms = (self._clock() - t0) * 1000
        s = self.stats
        counter = _COUNTER[outcome.status]
        setattr(s, counter, getattr(s, counter) + 1)
        if outcome.status == "repeat":
            s.repeats += 1
        elif outcome.status == "typing_through":
            s.typing_through_hits += 1
        if outcome.status in _ANSWERS:
            # Only real answers: instant "not loaded yet" answers would flatter the percentiles.
            s.latencies_ms.append(ms)
        if outcome.text:
            outcome.id = f"c{next(self._ids)}"
            self._shown[outcome.id] = len(outcome.text)
        if log.isEnabledFor(logging.DEBUG):
            where = (f"{req.position[0]}:{req.position[1]}" if req.position is not None
                     else f"@{req.offset}")
            tokens = len(outcome.result.tokens) if outcome.result is not None else 0
            log.debug("request id=%s %s %s outcome=%s tokens=%d ms=%.1f", req.request_id,
                      req.key, where, outcome.status, tokens, ms)
        return outcome

    @staticmethod
    async def _until_superseded(job: _Job, fut: asyncio.Future) -> None:
        superseded = asyncio.ensure_future(job.superseded.wait())
        try:
            await asyncio.wait([fut, superseded], return_when=asyncio.FIRST_COMPLETED)
        finally:
            superseded.cancel()

    def _abandon(self, job: _Job, status: str) -> Outcome:
        job.abandoned = True
        job.cancel.cancel()
        if job.future is not None and job.future.done():
            self._account(job)
        return Outcome(None, status)

    def _account(self, job: _Job) -> None:
        """The engine's counts of one generation, once, whether its answer was seen or not."""
        if job.accounted or job.future is None or job.future.cancelled():
            return
        job.accounted = True
        if job.future.exception() is not None:
            return
        result, _ = job.future.result()
        if result is None:
            return
        self.rhythm.generated(result.wall_s, len(result.tokens), result.prefill_tokens)
        s = self.stats
        # Decode forwards only, as the engine counts them: a cancelled prefill is not waste,
        # since the engine keeps the KV it computed and the next keystroke's prompt reuses it.
        s.target_forwards += result.target_forwards
        if job.abandoned or result.cancelled:
            s.wasted_target_forwards += result.target_forwards
        s.prefill_tokens += result.prefill_tokens
        s.cache_reused_tokens += result.reused_tokens
        s.proposed += result.proposed
        s.accepted += result.accepted
        s.generated_tokens += len(result.tokens)

    # Runs on the engine thread: everything that touches the engine or its tokenizer, inside
    # the future, so whatever raises here (the prompt included) ends as one "error" outcome.
    def _run(self, engine: Any, job: _Job, req: CompletionRequest, settings: Settings,
             max_tokens: int) -> tuple[GenerationResult | None, str | None]:
        if job.cancel.cancelled:
            return None, None  # overtaken while queued: no forward spent
        return complete_at(engine, self._context_builder(engine, settings), req.key,
                           _clean(req.source), req.offset, max_tokens=max_tokens,
                           cancel=job.cancel, others=[(n, _clean(t)) for n, t in req.others],
                           roots=req.roots,
                           min_confidence=settings.min_confidence, copy_weight=settings.copy_weight)

    def _warm(self, engine: Any, job: _Job, req: CompletionRequest, settings: Settings) -> None:
        if job.cancel.cancelled:
            return
        try:
            prefill_at(engine, self._context_builder(engine, settings), req.key,
                       _clean(req.source), req.offset,
                       [(n, _clean(t)) for n, t in req.others], cancel=job.cancel,
                       roots=req.roots)
        except Exception:
            log.debug("warm prefill failed", exc_info=True)  # only an optimisation

    def _context_builder(self, engine: Any, settings: Settings) -> ContextBuilder:
        budget = settings.context_tokens or default_context_tokens(
            engine.context_window, settings.max_tokens)
        key = (budget, settings.workspace_context)
        if self._builder is None or self._builder[0] != key or self._builder[2]() is not engine:
            count = weakref.WeakMethod(engine.count_tokens)  # weak: a reload frees the old engine
            self._builder = key, ContextBuilder(lambda text: count()(text), budget,
                                                fim_tokens=engine.fim_tokens,
                                                workspace_context=settings.workspace_context), \
                weakref.ref(engine)
        return self._builder[1]

    # ------------------------------------------------------------ reporting

    def record_feedback(self, kind: str, completion_id: Any) -> bool:
        """kind: shown | accepted | partial. Only ids this server handed out count."""
        if not isinstance(completion_id, str) or completion_id not in self._shown:
            return False
        if kind == "shown":
            self.stats.shown += 1
        elif kind == "accepted":
            self.stats.accepted_suggestions += 1
        elif kind == "partial":
            self.stats.partially_accepted += 1
        return True

    def stats_dict(self) -> dict:
        s, engine = self.stats, self.host.engine
        return {
            "requests": s.requests,
            "answered": s.answered,
            "cancelled": s.cancelled,
            "superseded": s.superseded,
            "typing_through_hits": s.typing_through_hits,
            "cache_reused_tokens": s.cache_reused_tokens,
            "prefill_tokens": s.prefill_tokens,
            "acceptance_rate": round(s.accepted / s.proposed, 4) if s.proposed else 0.0,
            "tokens_per_target_forward":
                round(s.generated_tokens / s.target_forwards, 4) if s.target_forwards else 0.0,
            "latency_ms_p50": s.percentile(0.5),
            "latency_ms_p95": s.percentile(0.95),
            "draft": getattr(engine, "draft_name", None),
            "target": getattr(engine, "target_name", None),
            "device": getattr(engine, "device", None),
            "state": self.host.state,
            **backend_stats(engine),
        }

    def counters(self) -> dict:
        """Raw counts beyond the stats contract, for the server benchmark and debugging."""
        s = self.stats
        return {
            "not_ready": s.not_ready,
            "disabled": s.disabled,
            "errors": s.errors,
            "repeats": s.repeats,
            "target_forwards": s.target_forwards,
            "wasted_target_forwards": s.wasted_target_forwards,
            "wasted_forward_share":
                round(s.wasted_target_forwards / s.target_forwards, 4) if s.target_forwards else 0.0,
            "generated_tokens": s.generated_tokens,
            "shown": s.shown,
            "accepted": s.accepted_suggestions,
            "partially_accepted": s.partially_accepted,
            "shown_acceptance_rate":
                round(s.accepted_suggestions / s.shown, 4) if s.shown else 0.0,
            "error": self.host.error,
        }
