"""The typing rhythm: how long to wait and how much to generate, so a generation ends before
the next keystroke or waits for a pause. Pure arithmetic over recent timings (no asyncio, no
engine), so it is tested with plain numbers.
"""

from __future__ import annotations

from collections import deque

from codespec_lsp.stats import percentile


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

    def plan(self, base_s: float, max_tokens: int, line_start: bool = False) -> tuple[float, int]:
        """(debounce seconds, max new tokens) for the next request. `line_start`: the cursor is
        after a line's indentation, where typists pause to read a suggestion, so the debounce is
        never stretched there (a wasted generation when they type on is one per line)."""
        if len(self._gaps) < 2:
            return base_s, max_tokens
        typical = _median(list(self._gaps))
        if (cost := self.cost()) is not None:
            fixed, per = cost
            fits = int((typical * self.FILL - base_s - fixed) / per + 1e-9)
            if fits >= min(self.MIN_TOKENS, max_tokens):
                return base_s, min(max_tokens, fits)
        if line_start:
            return base_s, max_tokens
        # Past the typical gap, or the model would start just in time to be cancelled.
        return max(base_s, min(typical * 1.5, self.MAX_DEBOUNCE_S)), max_tokens


def _median(xs: list[float]) -> float:
    return percentile(xs, 0.5)  # the one percentile helper (nearest rank: the upper median)
