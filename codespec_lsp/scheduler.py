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
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Sequence

from cachetools import LRUCache

from codespec_lsp.config import Settings, default_context_tokens
from codespec_lsp.context import ContextBuilder
from codespec_lsp.engine.api import CancelToken, GenerationResult
from codespec_lsp.engine_host import EngineHost
from codespec_lsp.complete import complete_at, prefill_at, split_line  # noqa: F401 - split_line re-exported

log = logging.getLogger(__name__)

PREFIX_KEY_CHARS = 4096   # text before the cursor that identifies a cached suggestion
SUFFIX_KEY_CHARS = 512


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


class Rhythm:
    """Fits the generation to the typing rhythm.

    A generation still running at the next keystroke is cancelled before anyone sees it: pure
    waste on a shared accelerator. So, from the typical gap between keystrokes and a model of
    generation time, T(n) = fixed + per_token * n, fitted on recent generations:
    - if a suggestion of useful length fits in the gap, start after the configured debounce
      with max tokens cut to what fits (a pause gets its answer as fast as ever);
    - if not (typing faster than the model), stretch the debounce past the typical gap (1.5x,
      at most MAX_DEBOUNCE_S), so the model runs at the pauses, with full length;
      typing-through answers in between.
    Until generation time is measured the model counts as slow.
    """

    PAUSE_S = 1.0       # a longer gap is a pause, not part of the rhythm
    MAX_DEBOUNCE_S = 0.6  # the most the debounce is ever stretched to
    MIN_TOKENS = 6      # a shorter suggestion is not worth a model call
    FILL = 0.7          # share of the typical gap a generation may use (the rest is variance)
    WARM_PREFILL = 64   # generations that prefilled more (a cold file) say nothing of keystrokes

    def __init__(self) -> None:
        self._last: float | None = None
        self._gaps: deque = deque(maxlen=8)
        self._samples: deque = deque(maxlen=16)  # (tokens, wall seconds)

    def keystroke(self, now: float) -> None:
        if self._last is not None and now - self._last < self.PAUSE_S:
            self._gaps.append(now - self._last)
        self._last = now

    def generated(self, wall_s: float, tokens: int, prefill_tokens: int = 0) -> None:
        """From any generation, cancelled ones included: they ran at the same speed."""
        if tokens > 0 and prefill_tokens <= self.WARM_PREFILL:
            self._samples.append((tokens, wall_s))

    def cost(self) -> tuple[float, float] | None:
        """(fixed seconds, seconds per token): Theil-Sen over the recent generations, since a
        busy machine throws outliers that would drag a least-squares fit anywhere."""
        if not self._samples:
            return None
        pts = list(self._samples)
        slopes = [(w2 - w1) / (n2 - n1) for i, (n1, w1) in enumerate(pts)
                  for n2, w2 in pts[i + 1:] if n2 != n1]
        per = _median(slopes) if slopes else _median([w / (n + 1) for n, w in pts])
        per = max(per, 1e-4)
        return max(_median([w - per * n for n, w in pts]), 0.0), per

    def plan(self, base_s: float, max_tokens: int) -> tuple[float, int]:
        """(debounce seconds, max new tokens) for the next request."""
        if len(self._gaps) < 2:
            return base_s, max_tokens
        typical = _median(list(self._gaps))
        if (cost := self.cost()) is not None:
            fixed, per = cost
            fits = int((typical * self.FILL - base_s - fixed) / per + 1e-9)
            if fits >= min(self.MIN_TOKENS, max_tokens):
                return base_s, min(max_tokens, fits)
        # Past the typical gap, or the model would start just in time to be cancelled.
        return max(base_s, min(typical * 1.5, self.MAX_DEBOUNCE_S)), max_tokens


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2]


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
        suffix_hash = key[2]
        for old in reversed(self._recent.get(uri, ())):
            entry = self._lru.get(old)
            if entry is None or not entry.text or entry.offset >= offset or old[2] != suffix_hash:
                continue
            typed = source[entry.offset:offset]
            if len(typed) >= len(entry.text) or not entry.text.startswith(typed):
                continue
            if hash(source[max(0, entry.offset - PREFIX_KEY_CHARS):entry.offset]) != old[1]:
                continue
            return entry.text[len(typed):], "typing_through"
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



@dataclass
class Stats:
    requests: int = 0
    answered: int = 0
    cancelled: int = 0
    superseded: int = 0
    typing_through_hits: int = 0
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
        if not self.latencies_ms:
            return 0.0
        xs = sorted(self.latencies_ms)
        return round(xs[min(len(xs) - 1, int(q * len(xs)))], 2)


@dataclass
class CompletionRequest:
    key: str                                      # document uri
    source: str                                   # snapshot of the document text
    offset: int                                   # cursor, in code points
    others: Sequence[tuple[str, str]] = ()        # (name, text) of other open documents


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


# ---------------------------------------------------------------- scheduler


class Scheduler:
    def __init__(self, host: EngineHost, settings: Callable[[], Settings], *,
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.host = host
        self.settings = settings
        self.stats = Stats()
        self.cache = CompletionCache()
        self.debouncer = Debouncer(sleep)
        self.rhythm = Rhythm()
        self._calibrated: Any = None
        self._clock = clock
        self._executor = concurrent.futures.ThreadPoolExecutor(1, "codespec-engine")
        self._jobs: dict[str, _Job] = {}
        self._builder: tuple[tuple, ContextBuilder] | None = None
        self._ids = itertools.count(1)
        self._shown: LRUCache = LRUCache(512)
        self._lock = threading.Lock()

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

    async def complete(self, req: CompletionRequest) -> Outcome:
        t0 = self._clock()
        self.stats.requests += 1
        self.rhythm.keystroke(t0)
        outcome = await self._complete(req)
        if outcome.status == "superseded":
            self.stats.superseded += 1
        else:
            self.stats.answered += 1
            if outcome.status in ("answered", "repeat", "typing_through"):
                # Instant "not loaded yet" answers would flatter the percentiles.
                self.stats.latencies_ms.append((self._clock() - t0) * 1000)
        if outcome.text:
            outcome.id = f"c{next(self._ids)}"
            self._shown[outcome.id] = len(outcome.text)
        if log.isEnabledFor(logging.DEBUG):  # `--log-level debug`: one line per request
            log.debug("request %s %s@%d: %s, %d tokens, %.0f ms", outcome.id or "-", req.key,
                      req.offset, outcome.status,
                      len(outcome.result.tokens) if outcome.result is not None else 0,
                      (self._clock() - t0) * 1000)
        return outcome

    async def _complete(self, req: CompletionRequest) -> Outcome:
        t0 = self._clock()
        settings = self.settings()
        if not settings.enable:
            self._supersede(req.key)
            return Outcome(None, "disabled")
        if (hit := self.cache.get(req.key, req.source, req.offset)) is not None:
            self._supersede(req.key)  # the user moved on: older work for this document is moot
            self.stats.typing_through_hits += 1
            return Outcome(hit[0] or None, hit[1])
        engine = self.host.engine
        if engine is None:
            return Outcome(None, "not_ready")
        if self._calibrated is None or self._calibrated() is not engine:
            self._calibrated = weakref.ref(engine)  # weak: a reload must free the old engine
            if self.host.warmup is not None:
                self.rhythm.generated(self.host.warmup[1], self.host.warmup[0],
                                      self.host.warmup[2])
        self._supersede(req.key)
        job = self._jobs[req.key] = _Job()
        try:
            base = settings.debounce_ms / 1000
            delay, max_tokens = self.rhythm.plan(base, settings.max_tokens)
            loop = asyncio.get_running_loop()
            if delay > base and hasattr(engine, "prefill"):
                # Typing faster than the model answers: no generation until a pause, but keep the
                # KV cache level with the typing (a few tokens a keystroke), so the answer at
                # the pause prefills almost nothing. Prefill is never waste: the next prompt
                # reuses it.
                if not await self.debouncer.wait(req.key, base):
                    return self._abandon(job, "superseded")
                warm = loop.run_in_executor(self._executor, self._warm, engine, job, req, settings)
                await self._until_superseded(job, warm)
                if job.superseded.is_set():
                    return self._abandon(job, "superseded")
                delay = max(0.0, delay - (self._clock() - t0))
            if not await self.debouncer.wait(req.key, delay):
                return self._abandon(job, "superseded")
            if job.superseded.is_set():
                return self._abandon(job, "superseded")
            job.future = loop.run_in_executor(self._executor, self._run, engine, job, req,
                                              settings, max_tokens)
            job.future.add_done_callback(lambda f: job.abandoned and self._account(job))
            await self._until_superseded(job, job.future)
            if not job.future.done():  # a finished answer is delivered even if just overtaken
                return self._abandon(job, "superseded")
            result, text = job.future.result()
            self._account(job)
        except asyncio.CancelledError:
            self._abandon(job, "cancelled")
            self.stats.cancelled += 1
            raise
        except Exception:
            # An engine bug must cost one empty answer, not the server.
            log.exception("generation failed")
            return Outcome(None, "error")
        finally:
            if self._jobs.get(req.key) is job:
                del self._jobs[req.key]
        if result is None or result.cancelled:
            return Outcome(None, "superseded", result=result)
        if result.stop_reason == "error":  # e.g. the server is down: ask again next time
            return Outcome(None, "error", result=result)
        self.cache.put(req.key, req.source, req.offset, text or "")
        return Outcome(text, "answered", result=result)

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

    # Runs on the engine thread: everything that touches the engine or its tokenizer.
    def _run(self, engine: Any, job: _Job, req: CompletionRequest, settings: Settings,
             max_tokens: int) -> tuple[GenerationResult | None, str | None]:
        if job.cancel.cancelled:
            return None, None  # overtaken while queued: no forward spent
        return complete_at(engine, self._context_builder(engine, settings), req.key, req.source,
                           req.offset, max_tokens=max_tokens, cancel=job.cancel, others=req.others,
                           min_confidence=settings.min_confidence)

    def _warm(self, engine: Any, job: _Job, req: CompletionRequest, settings: Settings) -> None:
        if job.cancel.cancelled:
            return
        try:
            prefill_at(engine, self._context_builder(engine, settings), req.key, req.source,
                       req.offset, req.others, cancel=job.cancel)
        except Exception:
            log.debug("warm prefill failed", exc_info=True)  # only an optimisation

    def _context_builder(self, engine: Any, settings: Settings) -> ContextBuilder:
        budget = settings.context_tokens or default_context_tokens(
            engine.context_window, settings.max_tokens)
        key = (budget, settings.other_documents)
        if self._builder is None or self._builder[0] != key or self._builder[2]() is not engine:
            count = weakref.WeakMethod(engine.count_tokens)  # weak: a reload frees the old engine
            self._builder = key, ContextBuilder(lambda text: count()(text), budget,
                                                fim_tokens=engine.fim_tokens,
                                                other_documents=settings.other_documents), \
                weakref.ref(engine)
        return self._builder[1]

    # ------------------------------------------------------------ reporting

    def record_feedback(self, kind: str, completion_id: str | None) -> bool:
        """kind: shown | accepted | partial. Only ids this server handed out count."""
        if completion_id not in self._shown:
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
