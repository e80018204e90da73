"""A copy prior: a cache n-gram model of the tokens in context, mixed into the target's scores.

Code repeats itself locally far more than a model's weights can know: in a test file the line
after `self.assertEqual(...)` very often starts another `self.assertEqual(`, and a name or call
pattern used above comes back below. A cache n-gram model over the tokens in the prompt captures
that (Tu, Su & Devanbu, "On the localness of software", FSE 2014; Hellendoorn & Devanbu, FSE 2017).
Its distribution is mixed into the target's:

    p(t) = (1 - weight) * p_target(t) + weight * p_copy(t)

p_copy(t): for each order n in ORDERS whose last n tokens occurred before, the share of those
occurrences that t followed; averaged over the orders that matched. Where none matched, p is the
target's own distribution.

The prior scores the first line of the new text only (given `line_breaks`, as the engine does).
Mixed into every token it also copied whole lines the file already holds into the lines after
the first: 62 of 300 `bench quality` suggestions on benchmarks/heldout repeated a line from above
verbatim (the real code over the same lines: 4; `scripts/copied_lines.py`), which a user has no
use for. On the first line only, none did, and the common prefix with the real code hardly moved
(held out 3.40 → 3.48, on the tuning files 4.64 → 4.58).

The mix is part of the target's scores, as token healing's mask is:
greedy speculative output is the greedy output under these scores token for token (every verify
row counts the drafted tokens before it, as a step-by-step decode would have counted them once
accepted), and sampling follows the mixed distribution. Weight 0 is the target alone.

Sampling at temperature T and top-p: the mix is made first, from the target's untempered
distribution, and the sampler then tempers and cuts the MIX (speculative.adjust_probs over its
log): p ∝ mix^(1/T), then the smallest set of tokens reaching top_p, renormalised. So at T != 1
the copy share is tempered too (T < 1 sharpens what the prior and the target agree on); it is not
(1 - w) * tempered target + w * p_copy. Tested exactly at T 0.7, top-p 0.9 (test_copy_prior.py).
"""

from __future__ import annotations

import torch

ORDERS = (2, 3, 4)
# Picked with `bench quality --points 300` on 14 of CPython's own test files (neither training
# nor benchmarks/heldout read them): prefix chars 2.40 without the prior, 3.98 / 4.64 / 4.45 at
# weight 0.3 / 0.5 / 0.7, edit similarity 0.344 → 0.465 at 0.5; on benchmarks/corpus 1.95 without,
# 2.69 / 3.54 at 0.3 / 0.5 (benchmarks/results/copy_weight_cpu_tiny.json). Those runs mixed it
# into every token; on the first line only, the tuning files give 4.58.
COPY_WEIGHT = 0.5


class CopyPrior:
    """What followed each n-gram of one generation's tokens. The tokens stay the engine's: the
    index catches up with the sequence it is given, which only grows during a generation."""

    def __init__(self, weight: float = COPY_WEIGHT, orders: tuple[int, ...] = ORDERS,
                 line_breaks: dict[int, int] | None = None, prompt_len: int = 0,
                 typed_breaks: int = 0) -> None:
        self.weight, self.orders = weight, orders
        self.followers: dict[tuple[int, ...], list[int]] = {}
        self.indexed = 0  # the tokens at positions < indexed are in `followers`
        # With line_breaks (id -> the newlines its text holds), the prior scores only the first
        # line of the new text: past it a copy is whole lines the file already holds.
        # typed_breaks: the newlines in the text token healing re-types first (the indentation).
        self.line_breaks, self.prompt_len, self.typed_breaks = line_breaks, prompt_len, typed_breaks

    def _index(self, seq: list[int]) -> None:
        for end in range(self.indexed, len(seq)):
            for n in self.orders:
                if end >= n:
                    self.followers.setdefault(tuple(seq[end - n:end]), []).append(seq[end])
        self.indexed = len(seq)

    def distribution(self, tokens: list[int]) -> dict[int, float]:
        """Sparse p_copy for the token after `tokens`; {} when no order matches. Positions past
        the index (drafted tokens not yet accepted) are counted by a scan."""
        found = []
        for n in self.orders:
            if len(tokens) <= n:
                continue
            key = tuple(tokens[-n:])
            followers = self.followers.get(key, [])
            fresh = [tokens[end] for end in range(max(self.indexed, n), len(tokens))
                     if tuple(tokens[end - n:end]) == key]
            if followers or fresh:
                found.append(followers + fresh)
        out: dict[int, float] = {}
        for followers in found:
            share = 1.0 / len(followers) / len(found)
            for t in followers:
                out[t] = out.get(t, 0.0) + share
        return out

    def mix(self, logits: torch.Tensor, seq: list[int], drafted: list[int]) -> torch.Tensor:
        """logits [K+1, V] (row i scores the token after seq + drafted[:i]) → where some order
        matches, the log of the mixed distribution. A token the logits rule out (-inf: token
        healing's mask) stays out; the copy mass falls on the others."""
        if self.weight <= 0:
            return logits
        self._index(seq)
        rows, ids, shares = [], [], []
        if self.line_breaks is not None:  # newlines in the accepted new tokens (a few dozen)
            breaks = sum(self.line_breaks.get(t, 0) for t in seq[self.prompt_len:])
        for i in range(len(drafted) + 1):
            if self.line_breaks is not None:
                if breaks > self.typed_breaks:
                    break  # this row and the rest are past the first line
                breaks += self.line_breaks.get(drafted[i], 0) if i < len(drafted) else 0
            copy = self.distribution(seq + drafted[:i])
            rows += [i] * len(copy)
            ids += copy
            shares += copy.values()
        if not rows:
            return logits
        device, scores = logits.device, logits.float()
        copy = torch.zeros_like(scores).index_put_(
            (torch.tensor(rows, device=device), torch.tensor(ids, device=device)),
            torch.tensor(shares, device=device), accumulate=True)
        copy *= torch.isfinite(scores)
        mass = copy.sum(-1, keepdim=True)
        mixed = torch.softmax(scores, -1) * (1 - self.weight) + copy * (self.weight / mass.clamp(min=1e-30))
        return torch.where(mass > 0, mixed.log(), scores).to(logits.dtype)
