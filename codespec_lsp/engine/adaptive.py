"""Adaptive K: how many tokens each draft source proposes per step, from measured numbers.

Promise: drafting never makes decoding slower than the target alone by more than the probes cost.
- The model: K = speedup.best_k(alpha, c, K_MAX, verify_cost), where alpha is the source's
  measured acceptance, c its measured time per drafted token and verify_cost[n] the measured time
  of a target forward over n+1 tokens, both in 1-token target forwards. Times are medians (verify
  costs: ratios of lower quartiles) of the recent forwards (the context length in use; noise-robust
  on a shared machine), and verify_cost is made non-decreasing in n, as it is physically.
- The check: the model can be wrong (noisy times, a verify whose cost the medians miss), so each
  source also keeps its realised rate over its recent drafting steps (mean tokens a step over the
  median seconds of draft and verify a step). When that is below the target's own rate (1 token
  per 1-token forward), the source is switched off (K = 0) and its window emptied.
- Probes: at K = 0 one K = 1 step is tried every `probe_every` steps, so a source that improves is
  noticed. A failed probe doubles the interval (up to PROBE_MAX), a kept one halves it and switches
  a source the check had switched off back on, with fresh evidence: what probes cost is bounded by
  one short step per PROBE_MIN steps at first, and falls off while they fail. (Before, the window
  kept the steps that switched the source off, so one unlucky run of rejections, likely at some
  point for a K = 1 source keeping 43 % of its drafts, kept the EAGLE head off for most of a run.)
"""

from __future__ import annotations

import statistics
from collections import deque

from codespec_lsp.engine.speedup import K_MAX, best_k

PROBE_MIN, PROBE_MAX = 16, 256
WINDOW = 8        # recent drafting steps the realised-rate check reads
MIN_EVIDENCE = 4  # drafting steps before the check may overrule the model
# Per step: the acceptance estimate weighs about thirty recent positions. With ten (0.9), six
# rejections in a row, which a K = 1 source keeping 43 % of its drafts meets once in a typical
# run, read 0.12, under what pays, and left it off until probes (one in 16 steps) recovered it.
ACCEPTANCE_DECAY = 0.97
MIN_TIMES = 3     # forwards over n tokens before their times stand for verify_cost[n - 1]
STALE = 256       # forwards after which a time is forgotten (VerifyTimes)


class VerifyTimes:
    """Recent target forward times by the number of tokens fed (1: plain decoding). A time older
    than STALE forwards is forgotten: a verify length measured during a burst of load looks dear,
    adaptive K then never feeds that many tokens again, and nothing would ever correct it; once
    forgotten, the length is assumed cheap again and re-measured the next time K reaches it."""

    def __init__(self, keep: int = 16) -> None:
        self._times: dict[int, deque[tuple[int, float]]] = {}  # n -> (forward index, seconds)
        self.keep = keep
        self._count = 0
        self._costs: list[float] | None = None  # recomputed every few records: it runs every step

    def record(self, n: int, seconds: float) -> None:
        self._count += 1
        self._times.setdefault(n, deque(maxlen=self.keep)).append((self._count, seconds))
        self._fresh = getattr(self, "_fresh", 0) + 1
        if self._fresh >= 4:
            self._costs, self._one, self._fresh = None, None, 0

    def _recent(self, n: int) -> list[float]:
        return [s for i, s in self._times.get(n, ()) if i > self._count - STALE]

    def median(self, n: int) -> float | None:
        times = self._recent(n)
        return statistics.median(times) if times else None

    def quartile(self, n: int) -> float | None:
        """The lower quartile of the recent forwards over n tokens (None under MIN_TIMES)."""
        times = sorted(self._recent(n))
        return times[len(times) // 4] if len(times) >= MIN_TIMES else None

    def one(self) -> float | None:
        """The median 1-token forward (None until measured)."""
        if getattr(self, "_one", None) is None:
            self._one = self.median(1)
        return self._one

    def costs(self, k_max: int = K_MAX) -> list[float]:
        """verify_cost[k]: a forward over k+1 tokens in 1-token forwards; unmeasured lengths
        assume a little more per token, and the list never decreases."""
        if self._costs is not None and len(self._costs) == k_max + 1:
            return self._costs
        # A single slow forward (another process) must not set the cost of every longer K: the
        # list never decreases, so one bad 3-token time read 2.4 for K = 2..8. Ratios of lower
        # quartiles: another process only ever adds time, and forwards over n and over 1 tokens
        # are timed at different moments (timeit's rule, as bench engine's).
        one, costs, floor = self.quartile(1), [], 1.0
        for k in range(k_max + 1):
            low = self.quartile(k + 1)
            cost = low / one if (low and one) else 1.0 + 0.05 * k
            floor = max(floor, cost)
            costs.append(floor)
        costs[0] = 1.0
        self._costs = costs
        return costs


class KController:
    """Adaptive K for one draft source (see the module's promise)."""

    def __init__(self, prior_alpha: float, prior_cost: float, k_max: int = K_MAX) -> None:
        self.k_max = k_max
        self.kept, self.trials = prior_alpha * 4, 4.0  # a prior worth four observed positions
        self.prior_cost = prior_cost
        self.draft_s: deque[float] = deque(maxlen=16)    # seconds per drafted token
        self.steps: deque[tuple[int, float]] = deque(maxlen=WINDOW)  # (tokens, seconds) drafting
        self.idle_steps, self.probe_every, self.probing = 0, PROBE_MIN, False
        self.off = False  # switched off by the check until a probe is kept

    @property
    def alpha(self) -> float:
        return self.kept / self.trials

    def cost(self, target_s: float | None) -> float:
        if not self.draft_s or not target_s:
            return self.prior_cost
        return statistics.median(self.draft_s) / target_s

    def pays(self, target_s: float | None) -> bool:
        """Whether recent drafting steps beat the target alone (True until there is evidence)."""
        if not target_s or len(self.steps) < MIN_EVIDENCE:
            return True
        # Mean tokens over the median step time. The time's median: one step slowed by another
        # process must not decide alone. The tokens' mean: a step keeps its draft or not, so at an
        # acceptance under one half the median step yields one token and read a K = 1 source that
        # pays (1.5 tokens a step for 1.1 forwards) as slower than the target.
        tokens = statistics.fmean(tokens for tokens, _ in self.steps)
        return tokens / statistics.median(seconds for _, seconds in self.steps) * target_s >= 1.0

    def choose(self, target_s: float | None, verify_cost: list[float]) -> int:
        """K for the next step. target_s: the median 1-token target forward (None: unmeasured)."""
        if not self.off and not self.pays(target_s):
            self.off = True
            self.steps.clear()
        k = 0 if self.off else best_k(self.alpha, self.cost(target_s), self.k_max, verify_cost)[0]
        self.probing = False
        if k == 0:
            self.idle_steps += 1
            if self.idle_steps >= self.probe_every:
                self.idle_steps, self.probing = 0, True
                return 1
        return k

    def record(self, proposed: int, kept: int, seconds: float, tokens: int | None = None,
               step_s: float | None = None) -> None:
        """A step that verified `proposed` drafts of this source and kept `kept`; `seconds` drafting
        them, `step_s` the whole step (draft and verify) that yielded `tokens`. A step where the
        source proposed nothing (the n-gram lookup found no match) was the target alone: counted
        as drafting, its one token per forward made the source look slower than the target and
        switched a free drafter off."""
        if proposed == 0:
            self.probing = False  # an unanswered probe: the next idle period tries again
            return
        decay = ACCEPTANCE_DECAY
        rejections = 1 if kept < proposed else 0
        self.kept = self.kept * decay + kept
        self.trials = self.trials * decay + kept + rejections
        if proposed:
            self.draft_s.append(seconds / proposed)
        if tokens is not None and step_s:
            self.steps.append((tokens, step_s))
        if self.probing:
            self.probe_every = (max(PROBE_MIN, self.probe_every // 2) if kept
                                else min(PROBE_MAX, self.probe_every * 2))
            self.probing = False
            self.off = self.off and not kept
