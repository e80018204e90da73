"""Prompt building: which part of the document the model sees, in which template.

Promises:
- The prefix fits the token budget and starts at a line boundary.
- The prompt's start is STABLE while the user types: the cut point is remembered per document
  and only moves when the prefix outgrows the budget or shrinks far below it (hysteresis). The
  engine's KV prefix cache then serves every keystroke but the rare re-cut from memory.
- With FIM tokens (CodeLlama base: `<PRE> … <SUF> … <MID>`) the suffix goes in the prompt;
  prefix-only models (the tiny pair, CodeLlama-Python) get the prefix alone. Either way the
  suffix is returned for post-processing.
- Knows token counts and templates, never LSP types; the token counter is injected.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Sequence

# Code rarely exceeds this many characters per token; it bounds how much text is ever tokenized,
# so a 1 MB document costs no more than a small one.
MAX_CHARS_PER_TOKEN = 8
# After a re-cut the prefix fills this share of the budget, leaving room to type before the next.
RECUT_FILL = 0.75
# A kept cut whose prefix fell under this share (cursor moved up, text deleted) is re-cut.
LOW_WATER = 0.5
SUFFIX_SHARE = 0.25   # of the budget, for the FIM suffix
SNIPPET_SHARE = 0.2   # of the budget, for other-document snippets
POSTPROCESS_SUFFIX_CHARS = 2000
LOOKUP_CHARS = 200_000
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Prompt:
    text: str             # what the engine gets (it adds BOS itself)
    prefix: str           # document text from the cut to the cursor
    suffix: str           # document text after the cursor (bounded), for post-processing
    fim: bool
    cut: int              # document offset where the prefix starts
    lookup_text: str = "" # extra text the n-gram drafter may copy from


@dataclass
class _CutState:
    cut: int
    snippets: str = ""


def fim_prompt(fim_tokens: tuple[str, str, str], prefix: str, suffix: str) -> str:
    pre, suf, mid = fim_tokens
    if pre == "<PRE>":
        # CodeLlama's documented infilling format puts a space after <PRE> and before <MID>.
        return f"{pre} {prefix} {suf}{suffix} {mid}"
    return f"{pre}{prefix}{suf}{suffix}{mid}"


def _line_starts(text: str, lo: int, hi: int) -> list[int]:
    """Offsets in [lo, hi] that begin a line."""
    starts = [lo] if lo == 0 or text[lo - 1] == "\n" else []
    i = text.find("\n", lo, hi)
    while i != -1 and i + 1 <= hi:
        starts.append(i + 1)
        i = text.find("\n", i + 1, hi)
    return starts


@dataclass
class ContextBuilder:
    count_tokens: Callable[[str], int]
    budget: int
    fim_tokens: tuple[str, str, str] | None = None
    other_documents: bool = False
    _state: dict[str, _CutState] = field(default_factory=dict)

    def forget(self, key: str) -> None:
        self._state.pop(key, None)

    def build(self, key: str, source: str, offset: int,
              others: Sequence[tuple[str, str]] = ()) -> Prompt:
        """`others`: (name, text) of the other open documents."""
        offset = max(0, min(offset, len(source)))
        suffix_full = source[offset:offset + POSTPROCESS_SUFFIX_CHARS]
        suffix_budget = int(self.budget * SUFFIX_SHARE) if self.fim_tokens else 0
        snippet_budget = int(self.budget * SNIPPET_SHARE) if self.other_documents and others else 0
        prefix_budget = max(self.budget - suffix_budget - snippet_budget, 16)

        state = self._state.get(key)
        if state is None or not self._keep(state.cut, source, offset, prefix_budget):
            cut = self._recut(source, offset, prefix_budget)
            snippets = self._snippets(source[cut:offset], others, snippet_budget)
            state = self._state[key] = _CutState(cut, snippets)
        prefix = source[state.cut:offset]

        if self.fim_tokens:
            suffix = self._fit_suffix(suffix_full, suffix_budget)
            text = fim_prompt(self.fim_tokens, state.snippets + prefix, suffix)
        else:
            text = state.snippets + prefix
        lookup = "\n".join(t[:LOOKUP_CHARS] for _, t in others)[:LOOKUP_CHARS]
        return Prompt(text=text, prefix=prefix, suffix=suffix_full, fim=bool(self.fim_tokens),
                      cut=state.cut, lookup_text=suffix_full + "\n" + lookup)

    def _keep(self, cut: int, source: str, offset: int, budget: int) -> bool:
        if cut > offset or (cut > 0 and source[cut - 1] != "\n"):
            return False  # the text above changed shape or the cursor moved above the cut
        if offset - cut > budget * MAX_CHARS_PER_TOKEN * 2:
            return False  # far too long to be within budget: skip tokenizing it
        n = self.count_tokens(source[cut:offset])
        if n > budget:
            return False
        return cut == 0 or n >= budget * LOW_WATER

    def _recut(self, source: str, offset: int, budget: int) -> int:
        goal = int(budget * RECUT_FILL)
        lo = max(0, offset - budget * MAX_CHARS_PER_TOKEN)
        if lo == 0 and self.count_tokens(source[:offset]) <= goal:
            return 0
        starts = _line_starts(source, lo, offset)
        if not starts:
            # One huge line: cut by characters; stability is lost, correctness is not.
            return max(0, offset - goal * 3)
        # Binary search for the earliest line start whose prefix fits the goal.
        a, b = 0, len(starts) - 1
        if self.count_tokens(source[starts[b]:offset]) > goal:
            return max(starts[b], offset - goal * 3)
        while a < b:
            m = (a + b) // 2
            if self.count_tokens(source[starts[m]:offset]) <= goal:
                b = m
            else:
                a = m + 1
        return starts[a]

    def _fit_suffix(self, suffix: str, budget: int) -> str:
        text = suffix[:budget * MAX_CHARS_PER_TOKEN]
        if "\n" in text and len(text) < len(suffix):
            text = text[:text.rfind("\n") + 1]  # whole lines only
        while text and self.count_tokens(text) > budget:
            cut = text.rfind("\n", 0, len(text) - 1)
            text = text[:cut + 1] if cut > 0 else text[:len(text) // 2]
        return text

    def _snippets(self, prefix: str, others: Sequence[tuple[str, str]], budget: int) -> str:
        """Copilot-style: the windows of other files most like the text above the cursor,
        as comments, chosen once per cut so the prompt's start stays stable."""
        if budget <= 0:
            return ""
        query = set(_WORD.findall("\n".join(prefix.splitlines()[-20:])))
        if not query:
            return ""
        scored: list[tuple[float, str, str]] = []
        for name, text in others:
            lines = text[:LOOKUP_CHARS].splitlines()
            for start in range(0, max(len(lines) - 5, 1), 5):
                window = "\n".join(lines[start:start + 10])
                words = set(_WORD.findall(window))
                if words:
                    jaccard = len(query & words) / len(query | words)
                    scored.append((jaccard, name, window))
        out, used = [], 0
        for score, name, window in sorted(scored, key=lambda s: -s[0])[:4]:
            if score < 0.1:
                break
            header = f"# Compare this snippet from {name}:\n"
            block, n = header, self.count_tokens(header)
            for line in window.splitlines():
                m = self.count_tokens(f"# {line}\n")
                if used + n + m > budget:
                    break
                block, n = block + f"# {line}\n", n + m
            if block != header:
                out.append(block)
                used += n
        return "".join(out)
