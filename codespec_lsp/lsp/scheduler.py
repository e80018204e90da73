"""What runs when: the single engine worker, debounce and warm prefill, answers from memory.
Plain asyncio objects, testable without an LSP client. Loading is host.py's job; "this request
is stale" is supersede.py's; counting is stats.py's.

Promises:
- One engine worker thread: the engine is not thread-safe, and one model pair saturates the
  accelerator anyway. Prompt building also runs there, since it uses the engine's tokenizer.
- The newest request for a document wins: an older one still debouncing, queued or generating
  goes stale (its ticket) and answers "superseded" at once; the engine stops within one forward.
- A cancelled request ($/cancelRequest → asyncio cancellation) makes its ticket stale too.
- Typing through a shown suggestion, or asking again at the same place, answers from memory
  with no model call, as long as the model, the settings and the prompt's text are the same.
- The debounce and the suggestion length follow the typing rhythm (Rhythm), so generations
  end before the next keystroke or wait for a pause, and the prompt cache is kept warm.
- Every target forward is accounted exactly once as used (its answer was delivered) or wasted,
  and every request once by its outcome (stats.RequestStats).
- A fault in one request (bad text, an engine error) costs that request an empty answer, never
  the worker or another document.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import time
import weakref
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Sequence

from codespec_lsp.config import Settings, default_context_tokens
from codespec_lsp.completion.context import ContextBuilder, Prompt
from codespec_lsp.engine.api import GenerationResult
from codespec_lsp.lsp.cache import CompletionCache
from codespec_lsp.lsp.documents import clean
from codespec_lsp.lsp.host import EngineHost
from codespec_lsp.lsp.supersede import CANCELLED, Supersede, Ticket
from codespec_lsp.completion.rhythm import Rhythm
from codespec_lsp.stats import FaultLog, RequestStats
from codespec_lsp.completion.complete import complete_at, prefill_at, split_line  # noqa: F401 - split_line re-exported

log = logging.getLogger(__name__)


@dataclass
class CompletionRequest:
    key: str                                      # document uri
    source: str                                   # snapshot of the document text
    offset: int                                   # cursor, in code points
    others: Sequence[tuple[str, str]] = ()        # (uri, text) of other open documents
    roots: Sequence[str] = ()                     # workspace folder URIs, for workspace context
    edits: Sequence[tuple[str, str]] = ()         # (uri, text) just edited elsewhere, latest first
    request_id: Any = None                        # the LSP request id, for the log line
    position: tuple[int, int] | None = None       # (line, character) as the client sent it

    @property
    def line_prefix(self) -> str:
        """The text before the cursor on its line."""
        return self.source[self.source.rfind("\n", 0, self.offset) + 1:self.offset]


@dataclass
class Outcome:
    text: str | None
    status: str   # answered|repeat|typing_through|superseded|cancelled|not_ready|disabled|error
    id: str | None = None
    result: GenerationResult | None = None
    replace: int = 0  # characters right of the cursor the text replaces (closers typed over)


@dataclass(eq=False)
class _Job:
    ticket: Ticket
    future: asyncio.Future | None = None
    abandoned: bool = False   # its answer will not be delivered: its forwards are waste
    accounted: bool = False
    continued: bool = False   # answered early; the generation goes on (Scheduler._answer_early)


@dataclass
class _Ran:
    """What the engine thread hands back for one request."""
    result: GenerationResult | None
    text: str | None = None
    prompt: Prompt | None = None


class _Recording:
    """The builder complete_at is handed: it keeps the prompt it built, so the answer is cached
    under the whole window the model saw."""

    def __init__(self, builder: ContextBuilder) -> None:
        self.builder = builder
        self.prompt: Prompt | None = None

    def build(self, *args: Any, **kwargs: Any) -> Prompt:
        self.prompt = self.builder.build(*args, **kwargs)
        return self.prompt

    def __getattr__(self, name: str) -> Any:
        return getattr(self.builder, name)


def _remember(cache: CompletionCache, req: CompletionRequest, text: str | None,
              prompt: Prompt | None) -> None:
    """Cached under the whole window the model saw (the prompt's cut and suffix)."""
    cache.put(req.key, req.source, req.offset, text or "",
              prompt_start=getattr(prompt, "cut", 0) if prompt is not None else None,
              prompt_suffix_chars=len(prompt.suffix) if prompt is not None else 0)


def _resolver(loop: asyncio.AbstractEventLoop, fut: asyncio.Future) -> Callable[[Any], None]:
    """A callback for the engine thread that resolves `fut` on the event loop (once)."""
    def resolve(value: Any) -> None:
        loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result(value))
    return resolve


def _first(*futures: asyncio.Future) -> asyncio.Future:
    """Done when the first of `futures` is (they are left running)."""
    return asyncio.ensure_future(asyncio.wait(futures, return_when=asyncio.FIRST_COMPLETED))


def _clean_all(named: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """(name, text) pairs with each text made safe for the tokenizer (documents.clean)."""
    return [(name, clean(text)) for name, text in named]


class Scheduler:
    def __init__(self, host: EngineHost, settings: Callable[[], Settings], *,
                 stats: RequestStats | None = None,
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
                 clock: Callable[[], float] = time.perf_counter,
                 executor: concurrent.futures.Executor | None = None) -> None:
        """`executor`: the engine's one thread; sessions of one TCP/WebSocket server share one
        (the engine is not thread-safe), a stdio server owns its own. `stats`: the session's
        counts, which the scheduler adds to."""
        self.host = host
        self.settings = settings
        self.stats = stats if stats is not None else RequestStats()
        self.cache = CompletionCache()
        self.stale = Supersede(sleep)
        self.rhythm = Rhythm()
        self.faults = FaultLog(log)
        self._calibrated: weakref.ref | None = None
        self._cached_under: tuple[Callable[[], Any], Settings] | None = None
        self._clock = clock
        self._executor = executor or concurrent.futures.ThreadPoolExecutor(1, "codespec-engine")
        self._builder: tuple | None = None
        self._growing: dict[str, Ticket] = {}  # documents whose early answer is still being written

    def close(self) -> None:
        self.stale.close()
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def drain(self) -> None:
        """Until the engine thread is idle (the session ends; the next one may use it)."""
        await asyncio.to_thread(self._executor.shutdown, True)

    def forget(self, key: str) -> None:
        self.cache.forget(key)
        self.stale.supersede(key)
        if self._builder is not None:
            self._builder[1].forget(key)

    async def complete(self, req: CompletionRequest) -> Outcome:
        t0 = self._clock()
        self.stats.started()
        self.rhythm.keystroke(t0)
        try:
            outcome = await self._complete(req, t0)
        except asyncio.CancelledError:
            self._finish(req, Outcome(None, "cancelled"), t0)
            raise
        except Exception as exc:  # a bug of ours: one empty answer, and the server goes on
            self.faults.fault(exc)
            outcome = Outcome(None, "error")
        return self._finish(req, outcome, t0)

    async def _complete(self, req: CompletionRequest, t0: float) -> Outcome:
        settings = self.settings()
        if not settings.enable:
            self.stale.supersede(req.key)
            return Outcome(None, "disabled")
        engine = self.host.engine
        self._cache_under(engine, settings)
        if (hit := self.cache.get(req.key, req.source, req.offset)) is not None:
            growing = self._growing.get(req.key)
            if growing is None or growing.stale:  # a suggestion still being written is typed into
                self.stale.supersede(req.key)  # the user moved on: older work for it is moot
            return Outcome(hit.text or None, hit.status, replace=hit.replace)
        if engine is None:
            return Outcome(None, "not_ready")
        self._calibrate(engine)
        job = _Job(self.stale.issue(req.key))
        try:
            max_tokens = await self._wait_for_turn(job, req, settings, engine, t0)
            if max_tokens is None:
                return self._abandon(job)
            return await self._generate(job, req, settings, engine, max_tokens, t0)
        except asyncio.CancelledError:
            job.ticket.expire(CANCELLED)
            self._abandon(job)
            raise
        finally:
            if not job.continued:  # an answer given early keeps its ticket until it ends
                self.stale.release(job.ticket)

    def _cache_under(self, engine: Any, settings: Settings) -> None:
        """The cache holds one model's answers under one set of settings: a reload, or any
        change of preset, maxTokens, minConfidence, copyWeight... empties it."""
        under = self._cached_under
        if under is not None and under[0]() is engine and under[1] == settings:
            return
        self.cache.clear()
        # Weak: a reload must free the old engine.
        self._cached_under = (weakref.ref(engine) if engine is not None else lambda: None), settings

    def _calibrate(self, engine: Any) -> None:
        """The load's warm generation teaches the rhythm once per engine."""
        if self._calibrated is None or self._calibrated() is not engine:
            self._calibrated = weakref.ref(engine)  # weak: a reload must free the old engine
            if self.host.warmup is not None:
                tokens, wall_s, prefill = self.host.warmup
                self.rhythm.generated(wall_s, tokens, prefill)

    async def _wait_for_turn(self, job: _Job, req: CompletionRequest, settings: Settings,
                             engine: Any, t0: float) -> int | None:
        """Debounce (stretched by the rhythm); the max tokens to generate, or None if the
        request went stale meanwhile."""
        base = settings.debounce_ms / 1000
        delay, max_tokens = self.rhythm.plan(base, settings.max_tokens,
                                             line_start=not req.line_prefix.strip())
        if delay > base:
            # Typing faster than the model answers: no generation until a pause, but keep the
            # KV cache level with the typing (a few tokens a keystroke), so the answer at
            # the pause prefills almost nothing. Prefill is never waste: the next prompt
            # reuses it.
            if not await self.stale.debounce(job.ticket, base):
                return None
            warm = asyncio.get_running_loop().run_in_executor(
                self._executor, self._warm, engine, job.ticket, req, settings)
            warm.add_done_callback(functools.partial(_count_warm, self.stats))  # may end stale
            await job.ticket.until(warm)
            delay = max(0.0, delay - (self._clock() - t0))
        return max_tokens if await self.stale.debounce(job.ticket, delay) else None

    async def _generate(self, job: _Job, req: CompletionRequest, settings: Settings,
                        engine: Any, max_tokens: int, t0: float) -> Outcome:
        loop = asyncio.get_running_loop()
        early: asyncio.Future = loop.create_future()
        # Absolute, so time queued behind another document's generation counts against it too.
        deadline = (time.perf_counter() + settings.time_budget_ms / 1000 - (self._clock() - t0)
                    if settings.time_budget_ms else None)
        job.future = loop.run_in_executor(self._executor, self._run, engine, job.ticket, req, settings,
                                          max_tokens, deadline, _resolver(loop, early))
        # An overtaken generation is accounted (as waste) when it really ends.
        job.future.add_done_callback(lambda f: job.abandoned and self._account(job))
        either = _first(job.future, early)
        try:
            await job.ticket.until(either)
        finally:
            either.cancel()
        if not job.future.done() and early.done() and not job.ticket.stale:
            return self._answer_early(job, req, *early.result())
        if not job.future.done():  # a finished answer is delivered even if just overtaken
            return self._abandon(job)
        return self._delivered(job, req)

    def _delivered(self, job: _Job, req: CompletionRequest, early_text: str | None = None) -> Outcome:
        """The generation ended and its answer is (or, early, was) delivered."""
        self._account(job)
        if (exc := job.future.exception()) is not None:
            self.faults.fault(exc)
            return Outcome(None, "error")
        ran: _Ran = job.future.result()
        result = ran.result
        if result is None or result.cancelled:
            return Outcome(None, "superseded", result=result)
        if result.stop_reason == "error":  # e.g. the server is down: ask again next time
            return Outcome(None, "error", result=result)
        text = ran.text
        if early_text is not None and not (text or "").startswith(early_text):
            return Outcome(early_text, "answered", result=result)  # what was shown stays
        _remember(self.cache, req, text, ran.prompt)
        return Outcome(text, "answered", result=result)

    def _answer_early(self, job: _Job, req: CompletionRequest, text: str, prompt: Prompt) -> Outcome:
        """The time budget is spent: show what is written, and let the generation go on. Its
        ticket stays live, so the next keystroke that is not typing into it cancels it; typing
        into it is answered from the cache, which the whole suggestion replaces when it ends."""
        _remember(self.cache, req, text, prompt)
        self._growing[req.key] = job.ticket
        job.continued = True

        def ended(_: asyncio.Future) -> None:
            if self._growing.get(req.key) is job.ticket:
                del self._growing[req.key]
            self.stale.release(job.ticket)
            if not job.ticket.stale:
                self._delivered(job, req, early_text=text)
            else:
                self._account(job)
        job.future.add_done_callback(ended)
        return Outcome(text, "answered")

    def _finish(self, req: CompletionRequest, outcome: Outcome, t0: float) -> Outcome:
        """All of a request's accounting, in one place, whatever way it ended."""
        ms = (self._clock() - t0) * 1000
        outcome.id = self.stats.ended(outcome.status, ms, outcome.text)
        if log.isEnabledFor(logging.DEBUG):
            where = (f"{req.position[0]}:{req.position[1]}" if req.position is not None
                     else f"@{req.offset}")
            tokens = len(outcome.result.tokens) if outcome.result is not None else 0
            log.debug("request id=%s %s %s outcome=%s tokens=%d ms=%.1f", req.request_id,
                      req.key, where, outcome.status, tokens, ms)
        return outcome

    def _abandon(self, job: _Job) -> Outcome:
        """The request is stale: its answer, if one still comes, is not delivered."""
        job.abandoned = True
        if job.future is not None and job.future.done():
            self._account(job)
        return Outcome(None, job.ticket.reason or "superseded")

    def _account(self, job: _Job) -> None:
        """The engine's counts of one generation, once, whether its answer was seen or not."""
        if job.accounted or job.future is None or job.future.cancelled():
            return
        job.accounted = True
        if job.future.exception() is not None:
            return
        result = job.future.result().result
        if result is None:
            return
        self.rhythm.generated(result.wall_s, len(result.tokens), result.prefill_tokens)
        self.stats.generation(result, wasted=job.abandoned or result.cancelled)

    # Runs on the engine thread: everything that touches the engine or its tokenizer, inside
    # the future, so whatever raises here (the prompt included) ends as one "error" outcome.
    def _run(self, engine: Any, ticket: Ticket, req: CompletionRequest, settings: Settings,
             max_tokens: int, deadline: float | None = None,
             early: Callable[[tuple], None] | None = None) -> _Ran:
        if ticket.cancel.cancelled:
            return _Ran(None)  # overtaken while queued: no forward spent
        builder = _Recording(self._context_builder(engine, settings))
        result, text = complete_at(
            engine, builder, req.key, clean(req.source), req.offset, max_tokens=max_tokens,
            cancel=ticket.cancel, others=_clean_all(req.others),
            min_confidence=settings.min_confidence, copy_weight=settings.copy_weight, roots=req.roots,
            edits=_clean_all(req.edits), word_bias=settings.word_bias, exact=settings.exact,
            deadline=deadline, early=(lambda text: early((text, builder.prompt))) if early else None)
        return _Ran(result, text, builder.prompt)

    def _warm(self, engine: Any, ticket: Ticket, req: CompletionRequest,
              settings: Settings) -> Any:
        if ticket.cancel.cancelled:
            return None
        try:
            return prefill_at(engine, self._context_builder(engine, settings), req.key,
                              clean(req.source), req.offset,
                              _clean_all(req.others), cancel=ticket.cancel, roots=req.roots,
                              edits=_clean_all(req.edits))
        except Exception:
            log.debug("warm prefill failed", exc_info=True)  # only an optimisation
            return None

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


def _count_warm(stats: RequestStats, warm: asyncio.Future) -> None:
    """A warm prefill (Scheduler._warm: a GenerationResult, None when nothing ran) counted as prompt
    work like a completion's: on a loaded machine it can run the whole prompt, and the stats then
    read no prefill at all for the answer that used it."""
    if not warm.cancelled() and warm.exception() is None and warm.result() is not None:
        stats.prefilled(warm.result().prefill_tokens)
