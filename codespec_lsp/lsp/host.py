"""The engine's lifecycle for the server: load in a background thread, calibrate, warn.

Loading a 13B pair takes tens of seconds and may fail (a broken folder, a mismatched pair, out of
memory); the server keeps answering meanwhile, and a burst of setting changes loads once.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from codespec_lsp.completion.complete import run
from codespec_lsp.config import Settings, default_context_tokens
from codespec_lsp.engine.api import ModelLoadError

log = logging.getLogger(__name__)


def default_loader(settings: Settings) -> Any:
    if settings.remote:  # a server does the inference; no weights load here
        from codespec_lsp.remote import backend_from_settings
        return backend_from_settings(settings)
    from codespec_lsp.engine import load_engine
    return load_engine(preset=settings.preset, draft=settings.draft, target=settings.target,
                       device=settings.device, dtype=settings.dtype,
                       allow_download=settings.allow_download,
                       trust_remote_code=settings.trust_remote_code)


@dataclass
class LoadOutcome:
    ok: bool
    message: str
    warning: str | None = None


def plan_warning(engine: Any, context_tokens: int) -> str | None:
    """Ask the planner whether this pair fits and pays; None when fine or when it can't say."""
    if getattr(engine, "kind", "local") != "local":
        return None  # the server's pair: `codespec-lsp doctor --launch` plans it
    try:
        from codespec_lsp.planning.doctor import plan_pair
        import psutil
        gpu_mem = None
        if str(engine.device).startswith("cuda"):
            import torch  # the planner needs the free memory; only the loader side touches torch
            gpu_mem = torch.cuda.get_device_properties(torch.device(engine.device)).total_memory
        # From the configs only: measuring would run the engine off its worker thread and hold
        # up "ready" by seconds; `codespec-lsp doctor` measures on request.
        plan = plan_pair(engine.draft_name, engine.target_name,
                         gpu_mem or psutil.virtual_memory().total, context_tokens)
    except Exception as exc:  # a missing or failing planner must never break serving
        log.debug("planner unavailable: %s", exc)
        return None
    if not plan.get("fits", True):
        return f"{engine.target_name} + {engine.draft_name} will not fit: {plan.get('advice', '')}"
    if plan.get("expected_speedup", 1.0) < 1.0:
        return (f"speculative decoding with {engine.draft_name} is not expected to speed up "
                f"{engine.target_name} (x{plan['expected_speedup']:.2f}): {plan.get('advice', '')}")
    return None


async def _in_daemon_thread(fn: Callable, *args: Any) -> Any:
    """Like asyncio.to_thread, but a daemon thread: quitting the editor must not wait for a
    half-finished load of a large checkpoint."""
    loop = asyncio.get_running_loop()
    fut = loop.create_future()

    def run() -> None:
        try:
            value = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
            loop.call_soon_threadsafe(lambda e=exc: fut.done() or fut.set_exception(e))
        else:
            loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result(value))

    threading.Thread(target=run, name="codespec-load", daemon=True).start()
    return await fut


async def _maybe_await(value: Any) -> None:
    if inspect.isawaitable(value):
        await value


def _calibrate(engine: Any) -> tuple[int, float, int] | None:
    """One short warm generation at load, on real code at a realistic context length, so the
    first keystrokes are planned with a measured speed (and the kernels are warm).

    It is also the first forward, so it checks the model: a local engine whose first forward
    fails or gives NaN/inf log-probabilities (broken weights, float16 overflow) would load as
    "ready" and answer empty forever, so it raises ModelLoadError instead."""
    text = (Path(__file__).resolve().parent.parent / "completion" / "context.py").read_text(encoding="utf-8")[:5000]
    try:
        cold = run(engine.generate(engine.encode(text), max_new_tokens=1))  # not a keystroke
        r = run(engine.generate(engine.encode(text + "\n"), max_new_tokens=12))  # a keystroke
    except Exception as exc:
        if getattr(engine, "kind", "local") != "local":
            # A remote server may be busy or restarting: its health check reports outages.
            log.debug("calibration failed", exc_info=True)
            return None
        raise ModelLoadError(f"the first forward failed: {type(exc).__name__}: {exc}") from exc
    if not all(math.isfinite(lp) for lp in (*cold.logprobs, *r.logprobs)):
        raise ModelLoadError(
            "the target's first forward gave NaN or infinite log-probabilities: its weights "
            "are broken, or they overflow in this dtype (try --dtype float32 or bfloat16)")
    return len(r.tokens), r.wall_s, r.prefill_tokens


class EngineHost:
    """Holds the engine and its state (loading/ready/error); loads in a background thread.

    While one load runs, newer wishes only update what is wanted; the running loop picks the
    latest when it finishes, so a burst of setting changes loads once.
    """

    def __init__(self, loader: Callable[[Settings], Any] = default_loader,
                 on_ready: Callable[[], Any] | None = None) -> None:
        self._loader = loader
        # Called (or awaited) each time a load ends "ready", after on_done: the server tells the
        # client (codespec/ready) so it asks again at the cursor instead of waiting for a key.
        self.on_ready = on_ready
        self.engine: Any = None
        self.state = "loading"
        self.error: str | None = None
        self._loaded_key: tuple | None = None
        self._wanted: Settings | None = None
        self._running = False
        self.warmup: tuple[int, float, int] | None = None  # (tokens, wall s, prefill tokens)
        # (level "error" | "info", message) -> the user; a remote backend reports outages here.
        self.notify: Callable[[str, str], Any] | None = None

    def needs_load(self, settings: Settings) -> bool:
        return settings.model_key() != self._loaded_key

    async def load(self, settings: Settings,
                   on_start: Callable[[Settings], Any] = lambda s: None,
                   on_done: Callable[[LoadOutcome], Any] = lambda o: None) -> None:
        """Callbacks may be plain functions or coroutines (progress needs a client round trip)."""
        self._wanted = settings
        if self._running:
            return
        self._running = True
        try:
            while self._wanted is not None and self.needs_load(self._wanted):
                wanted = self._wanted
                # Drop the old pair first: two pairs at once may not fit in GPU memory.
                if callable(close := getattr(self.engine, "close", None)):
                    close()  # a remote backend's connections and thread
                self.engine, self.state, self.error = None, "loading", None
                await _maybe_await(on_start(wanted))
                outcome = await self._load_one(wanted)
                self._loaded_key = wanted.model_key()
                await _maybe_await(on_done(outcome))
                if outcome.ok and self.on_ready is not None and not self.needs_load(self._wanted):
                    try:
                        await _maybe_await(self.on_ready())
                    except Exception:  # a client gone away must not stop the next load
                        log.warning("on_ready failed", exc_info=True)
        finally:
            self._running = False

    async def _load_one(self, settings: Settings) -> LoadOutcome:
        try:
            engine = await _in_daemon_thread(self._loader, settings)
        except ModelLoadError as exc:
            self.state, self.error = "error", str(exc)
            return LoadOutcome(False, f"codespec: models not loaded: {exc}")
        except Exception as exc:
            name = type(exc).__name__
            hint = " (out of memory: try a smaller or GPTQ preset)" if "memory" in str(exc).lower() \
                or "OutOfMemory" in name else ""
            self.state, self.error = "error", f"{name}: {exc}{hint}"
            log.exception("model load failed")
            return LoadOutcome(False, f"codespec: models not loaded: {name}: {exc}{hint}")
        if self.notify is not None and hasattr(engine, "health"):
            loop, notify = asyncio.get_running_loop(), self.notify
            engine.health.set_notify(lambda level, msg: loop.call_soon_threadsafe(notify, level, msg))
        try:
            self.warmup = await _in_daemon_thread(_calibrate, engine)
        except ModelLoadError as exc:
            if callable(close := getattr(engine, "close", None)):
                close()
            self.state, self.error = "error", str(exc)
            log.error("model load failed: %s", exc)
            return LoadOutcome(False, f"codespec: models not loaded: {exc}")
        self.engine, self.state = engine, "ready"
        budget = settings.context_tokens or default_context_tokens(
            engine.context_window, settings.max_tokens)
        warning = await asyncio.to_thread(plan_warning, engine, budget)
        pair = f"{engine.target_name} + {engine.draft_name}" if engine.draft_name else engine.target_name
        return LoadOutcome(True, f"codespec: {pair} ready on {engine.device}", warning)
