"""Counting, not deciding: the one percentile helper (benchmarks and the server's stats report
the same p50/p95), a session's request accounting, and the de-duplicated fault log.

Promises:
- Every completion request is counted exactly once by its outcome: requests = answered +
  cancelled + superseded + not_ready + disabled + errors (once none is in flight).
- Every target forward is counted once, as used or as wasted (`generation`).
- Feedback counts only the ids this session handed out.
- Duck-typed over the engine, its results and the host, so any layer may import it.
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from cachetools import LRUCache

log = logging.getLogger(__name__)


def percentile(values: Iterable[float], q: float) -> float:
    """Nearest-rank percentile, q in [0, 1]; 0.0 for no values."""
    xs = sorted(values)
    if not xs:
        return 0.0
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def backend_stats(engine: Any) -> dict:
    """`backend` and the server's own rates (remote backends read them off its /metrics)."""
    out = {"backend": "local", "server_acceptance_rate": None, "server_prefix_cache_hit_rate": None,
           "preset": getattr(engine, "preset", None)}  # what runs: smol, tiny, ... (target: its folder)
    if callable(server_stats := getattr(engine, "server_stats", None)):
        stats = server_stats()
        out.update({k: stats.get(k) for k in out if k != "preset"})
    return out


# Outcome status -> the counter it increments (each request exactly one).
_COUNTER = {"answered": "answered", "repeat": "answered", "typing_through": "answered",
            "superseded": "superseded", "cancelled": "cancelled", "not_ready": "not_ready",
            "disabled": "disabled", "error": "errors"}
_ANSWERS = ("answered", "repeat", "typing_through")


def _rate(num: int, den: int, digits: int = 4) -> float:
    return round(num / den, digits) if den else 0.0


@dataclass
class RequestStats:
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
    by_source: dict = field(default_factory=dict)  # draft source -> [proposed, accepted]
    generated_tokens: int = 0
    target_forwards: int = 0
    wasted_target_forwards: int = 0
    shown: int = 0
    accepted_suggestions: int = 0
    partially_accepted: int = 0
    latencies_ms: deque = field(default_factory=lambda: deque(maxlen=2000))
    _ids: Any = field(default_factory=lambda: itertools.count(1), repr=False)
    _handed_out: LRUCache = field(default_factory=lambda: LRUCache(512), repr=False)

    def percentile(self, q: float) -> float:
        return round(percentile(self.latencies_ms, q), 2)

    # ------------------------------------------------------------ requests

    def started(self) -> None:
        self.requests += 1

    def ended(self, status: str, ms: float, text: str | None = None) -> str | None:
        """Count a finished request; the id its shown text is known by (feedback), or None."""
        counter = _COUNTER[status]
        setattr(self, counter, getattr(self, counter) + 1)
        if status == "repeat":
            self.repeats += 1
        elif status == "typing_through":
            self.typing_through_hits += 1
        if status in _ANSWERS:
            # Only real answers: instant "not loaded yet" answers would flatter the percentiles.
            self.latencies_ms.append(ms)
        if not text:
            return None
        cid = f"c{next(self._ids)}"
        self._handed_out[cid] = len(text)
        return cid

    def cancelled_before_start(self) -> None:
        """A request the client cancelled before its handler ran (the protocol layer sees it)."""
        self.started()
        self.ended("cancelled", 0.0)

    def prefilled(self, tokens: int) -> None:
        """Prompt tokens a warm prefill ran (no generation): prefill_tokens counts all prompt work."""
        self.prefill_tokens += tokens

    def generation(self, result: Any, wasted: bool) -> None:
        """One generation's counts (a GenerationResult), whether its answer was seen or not."""
        # Decode forwards only, as the engine counts them: a cancelled prefill is not waste,
        # since the engine keeps the KV it computed and the next keystroke's prompt reuses it.
        self.target_forwards += result.target_forwards
        if wasted:
            self.wasted_target_forwards += result.target_forwards
        self.prefill_tokens += result.prefill_tokens
        self.cache_reused_tokens += result.reused_tokens
        self.proposed += result.proposed
        self.accepted += result.accepted
        for name, (proposed, accepted) in getattr(result, "by_source", {}).items():
            counts = self.by_source.setdefault(name, [0, 0])
            counts[0], counts[1] = counts[0] + proposed, counts[1] + accepted
        self.generated_tokens += len(result.tokens)

    def feedback(self, kind: str, completion_id: Any) -> bool:
        """kind: shown | accepted | partial. Only ids this session handed out count."""
        if not isinstance(completion_id, str) or completion_id not in self._handed_out:
            return False
        if kind == "shown":
            self.shown += 1
        elif kind == "accepted":
            self.accepted_suggestions += 1
        elif kind == "partial":
            self.partially_accepted += 1
        return True

    # ------------------------------------------------------------ reports

    def report(self, host: Any) -> dict:
        """`codespec/stats`: the contract clients and benchmarks read. `host`: an EngineHost."""
        engine = host.engine
        return {
            "requests": self.requests,
            "answered": self.answered,
            "cancelled": self.cancelled,
            "superseded": self.superseded,
            "typing_through_hits": self.typing_through_hits,
            "cache_reused_tokens": self.cache_reused_tokens,
            "prefill_tokens": self.prefill_tokens,
            "acceptance_rate": _rate(self.accepted, self.proposed),
            "tokens_per_target_forward": _rate(self.generated_tokens, self.target_forwards),
            "latency_ms_p50": self.percentile(0.5),
            "latency_ms_p95": self.percentile(0.95),
            "draft": getattr(engine, "draft_name", None),
            "target": getattr(engine, "target_name", None),
            "device": getattr(engine, "device", None),
            "state": host.state,
            **backend_stats(engine),
        }

    def counters(self, host: Any) -> dict:
        """`codespec/counters`: raw counts beyond the stats contract (benchmarks, debugging)."""
        return {
            "not_ready": self.not_ready,
            "disabled": self.disabled,
            "errors": self.errors,
            "repeats": self.repeats,
            "target_forwards": self.target_forwards,
            "wasted_target_forwards": self.wasted_target_forwards,
            "wasted_forward_share": _rate(self.wasted_target_forwards, self.target_forwards),
            "generated_tokens": self.generated_tokens,
            "shown": self.shown,
            "accepted": self.accepted_suggestions,
            "partially_accepted": self.partially_accepted,
            "shown_acceptance_rate": _rate(self.accepted_suggestions, self.shown),
            # which draft source's tokens the target keeps (the stats contract has the total)
            "acceptance_by_source": {name: _rate(a, p) for name, (p, a) in sorted(self.by_source.items())},
            "error": host.error,
        }


class FaultLog:
    """A fault (an engine bug) costs one empty answer, not a traceback per keystroke: each kind
    is logged once with its traceback, repeats at debug level."""

    MAX_KINDS = 64

    def __init__(self, logger: logging.Logger = log) -> None:
        self._log = logger
        self._seen: set[str] = set()

    def fault(self, exc: BaseException) -> None:
        what = f"{type(exc).__name__}: {exc}"
        if what in self._seen:
            self._log.debug("generation failed again: %s", what)
            return
        if len(self._seen) < self.MAX_KINDS:
            self._seen.add(what)
        self._log.error("generation failed: %s", what, exc_info=exc)
