"""Token healing: the first generated token(s) must extend the text complete.py backed up over.

complete.py removed the prompt's last token(s) (the cursor was mid-token or right after
indentation) and passes their text as `heal`. While part of `heal` is still to come, the target may
only emit tokens whose text starts with the rest of `heal` (it is covered, then extended) or is a
non-empty prefix of it (it covers part). The mask is applied to the target's logits, so greedy
speculative output stays the target's own greedy output under the same constraint, and sampling
follows the target's constrained distribution (a draft proposing a masked token is just rejected).

When `heal` ends in indentation (the cursor sits right after it), the indentation is what the user
typed: a token covering `heal` may not go on with more spaces or tabs (byte-level BPE has
"\n        " as one token, and taking it after "\n    " was typed gives an 8-space line).
A token that covers it exactly may be followed by " word": that is how the tokenizer writes a
deeper line ("\n       " + " if" for 8 spaces), so the model taking "\n    " then " def" means a
`def` and postprocess.strip_doubled_indent drops the space. Forbidding that space here was tried:
the model, kept from the word it meant, wrote `._collections_abc = {}` or `. This is a string`
instead (7 of 300 `bench quality` points changed: three lost a right `def`, none gained).

`heal` ends inside a word: the word leans to the document's names (Heal, `words`). A 6-layer model
seeing `node.fixers_a` writes `nd_levels`, though the file uses `fixers_applied`; with the bias,
tokens that would make the word none of the names lose WORD_BIAS from their logits until the
word is finished, so a name the model strongly wants still comes, and greedy speculative output is
the target's own greedy output under the same scores (tested with a draft proposing unbiased
choices). Log-probs reported for the confidence gate are read from these scores too.
"""

from __future__ import annotations

import bisect
import re
import weakref
from collections.abc import Iterable
from typing import Any

import numpy
import torch
from cachetools import LRUCache

_WORD = re.compile(r"\w")
_IN_RUN = re.compile(r"[\w \t]")  # a character that goes on a word or a run of indentation
_WORD_CHARS = re.compile(r"\w*")
_TYPED_WORD = re.compile(r"\w+$")
# Picked with `bench quality --points 300` on 14 of CPython's own test files, which neither
# training nor benchmarks/heldout read: prefix chars 1.84 without it, 1.96 / 1.99 / 2.17 at
# 3 / 6 / 10, and 2.22 / 2.40 at 6 / 10 once indentation was healed by its longest piece too
# (benchmarks/results/word_bias_tuning_cpu_tiny.json). At 10 a new name still comes
# when the model is e^10 times surer of it than of any of the document's. 0 turns it off (the
# `wordBias` setting).
WORD_BIAS = 10.0
MASKS_KEPT = 64  # (rest, indent, device) masks kept; a [V] bool mask each (32 KB at 32,000 ids)


def typed_word(text: str) -> str:
    """The word (letters, digits, `_`) `text` ends in: "" when it ends in none."""
    typed = _TYPED_WORD.search(text)
    return typed.group(0) if typed else ""


def ends_in_indent(heal: str) -> bool:
    """Whether `heal` ends in indentation typed after its last newline (or at its start)."""
    tail = heal.rsplit("\n", 1)[-1]
    return bool(tail) and not tail.strip()


def advance(rest: str, text: str, indent: bool = False, longest: int = 0) -> str | None:
    """What is left of `rest` after a token reading `text`; None when the token breaks it.
    indent: `rest` ends the typed indentation, which the token may not lengthen.
    longest: the length of the longest text in the vocabulary that is a proper prefix of `rest`.
    A token covering only part of `rest` and stopping inside a word or a run of spaces must be that
    longest one: " f" + "eatures" is a split the model never saw in training (the tokenizer writes
    " feature" + "s"), and a model led into it writes words like "featuresh"; "\n" + "    " is
    one too (the tokenizer writes "\n   " + " if"), taken where the model meant a blank line or a
    dedent, and it went on with `= re.compile(...` or `------` (on 14 CPython test files
    `bench quality` prefix chars rose 2.17 → 2.40; on benchmarks/heldout 21 suggestions changed,
    2 gained and 2 lost)."""
    if text.startswith(rest):
        return None if indent and text[len(rest):len(rest) + 1] in (" ", "\t") else ""
    if text and rest.startswith(text) and (len(text) == longest or not _IN_RUN.match(rest, len(text))):
        return rest[len(text):]
    return None


class HealVocab:
    """A backend's id texts and the allowed-token masks read from them. A token is allowed only
    when its text starts with the rest or is a proper prefix of it, so a mask reads one range of
    the sorted texts and at most len(rest) lookups, not the whole vocabulary (a pass over 49,152
    ids cost 30-70 ms a keystroke). Keystrokes in one word or after one indentation heal the same
    text again and again, so masks are kept across requests, and on the device the logits live
    on (a GPU step would otherwise copy the mask there each time)."""

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts
        self._ids_of: dict[str, list[int]] = {}
        for i, t in enumerate(texts):
            if t:
                self._ids_of.setdefault(t, []).append(i)
        self._sorted = sorted(self._ids_of)  # for the ids whose text starts with a given text
        self._enders = [i for t, same in self._ids_of.items() if not _WORD.match(t) for i in same]
        self._masks: LRUCache = LRUCache(maxsize=MASKS_KEPT)
        self._typeable: LRUCache = LRUCache(maxsize=4096)  # (rest, indent) -> retypeable

    def allowed(self, rest: str, indent: bool, device: torch.device | str = "cpu") -> torch.Tensor:
        """[V] bool on `device`: the ids a token may take while `rest` is still to be re-typed.
        A token covering part of `rest` is allowed only when what it leaves can be re-typed too,
        so a constraint that starts re-typeable never reaches a row with nothing allowed."""
        key = (rest, indent, torch.device(device))
        if key not in self._masks:
            on_cpu = (rest, indent, torch.device("cpu"))
            if on_cpu not in self._masks:
                # numpy, not torch.zeros: torch fills 49,152 bools on its thread pool, which
                # on a busy 2-core machine cost 8 ms a mask (under 0.1 ms here)
                mask = numpy.zeros(len(self.texts), dtype=bool)
                mask[self._allowed_ids(rest, indent)] = True
                self._masks[on_cpu] = torch.from_numpy(mask)
            self._masks[key] = self._masks[on_cpu].to(key[2])
        return self._masks[key]

    def _allowed_ids(self, rest: str, indent: bool) -> list[int]:
        """The ids `allowed` sets: texts starting with `rest` (one sorted range), then the
        proper prefixes of `rest` that leave something re-typeable (advance's rule)."""
        ids: list[int] = []
        at = bisect.bisect_left(self._sorted, rest)
        while at < len(self._sorted) and self._sorted[at].startswith(rest):
            if advance(rest, self._sorted[at], indent) == "":
                ids += self._ids_of[self._sorted[at]]
            at += 1
        for n in self._partial_cuts(rest):  # what such a token leaves is rest[n:]
            if self.retypeable(rest[n:], indent):
                ids += self._ids_of[rest[:n]]
        return ids

    def retypeable(self, rest: str, indent: bool = False) -> bool:
        """Whether tokens the constraint allows can re-type all of `rest`. Not so for a character
        the vocabulary spells only in byte pieces (`é` in a vocabulary without it whole): those
        pieces read as "" (token_texts) and are never allowed, so backing up over it would leave
        a generation with no token to take."""
        key = (rest, indent)
        if key not in self._typeable:
            self._typeable[key] = self._covered(rest, indent) or any(
                self.retypeable(rest[n:], indent) for n in self._partial_cuts(rest))
        return self._typeable[key]

    def _covered(self, rest: str, indent: bool) -> bool:
        """Whether one token covers all of `rest` (and, after indentation, does not lengthen it)."""
        if rest in self._ids_of:
            return True
        at = bisect.bisect_right(self._sorted, rest)
        while at < len(self._sorted) and self._sorted[at].startswith(rest):
            if advance(rest, self._sorted[at], indent) == "":
                return True
            at += 1
        return False

    def _partial_cuts(self, rest: str) -> list[int]:
        """The lengths of the proper prefixes of `rest` a token may cover (advance's rule)."""
        longest = self.longest_prefix(rest)
        return [n for n in range(1, len(rest)) if rest[:n] in self._ids_of
                and advance(rest, rest[:n], longest=longest) is not None]

    def spanned(self, text: str) -> bool:
        """Whether some id's text goes on past `text` (starts with it and is longer)."""
        at = bisect.bisect_right(self._sorted, text)
        return at < len(self._sorted) and self._sorted[at].startswith(text)

    def ids_of(self, text: str) -> list[int]:
        """The ids whose text is `text` ([] if none)."""
        return self._ids_of.get(text, [])

    def longest_prefix(self, rest: str, proper: bool = True) -> int:
        """Length of the longest id text that is a prefix of `rest`, a proper one unless `proper`
        is False (0: none)."""
        top = len(rest) - 1 if proper else len(rest)
        return next((n for n in range(top, 0, -1) if rest[:n] in self._ids_of), 0)

    def advance(self, rest: str, token: int, indent: bool) -> str | None:
        return advance(rest, self.texts[token], indent, self.longest_prefix(rest))

    def word_keeping(self, rest: str, word: str, words: list[str]) -> list[int]:
        """Ids after which the word being typed, `word` so far with `rest` still to re-type, can
        still be one of `words` (each starting with `word`): a part of `rest`; or `rest` and then
        the longest piece of one of them the vocabulary has (as `advance` takes only the longest
        part of a word: `li` + `ed` is no split the tokenizer makes of `lied`); or `rest` and then
        all the rest of one of them, finished by a character no word holds. A token ending right
        at `word` counts only when `word` is one of them, for the same reason (`a` + `pplied`)."""
        ids = [i for n in range(1, len(rest)) for i in self._ids_of.get(rest[:n], ())]
        for w in words:
            more = w[len(word):]
            head = rest + more
            n = self.longest_prefix(head, proper=False)
            if n and (n > len(rest) or (n == len(rest) and not more)):
                ids += self._ids_of[head[:n]]
            if not head:  # the word is finished already: any token starting with a symbol
                ids += self._enders
                continue
            at = bisect.bisect_left(self._sorted, head)
            while at < len(self._sorted) and self._sorted[at].startswith(head):
                if len(self._sorted[at]) > len(head) and not _WORD.match(self._sorted[at], len(head)):
                    ids += self._ids_of[self._sorted[at]]
                at += 1
        return ids


class Heal:
    """The constraint for one generation: `rest` is the part of `heal` not yet generated.

    `words`: the document's identifiers. When `heal` ends inside a word that some of them begin
    with, then until that word is finished, a token that would make it none of them (a new name,
    or a path that reaches none) has its logit lowered by `word_bias`. A small model spells a name
    the file uses as a new one (`node.fixers_a` + `nd_levels`); the bias is part of the target's
    scores, like the mask, so speculative output stays the target's own greedy output under it."""

    def __init__(self, vocab: HealVocab, heal: str, words: Iterable[str] = (),
                 word_bias: float = WORD_BIAS) -> None:
        self.vocab, self.rest = vocab, heal
        self.indent = ends_in_indent(heal)  # the cursor is right after indentation
        typed = typed_word(heal)
        self.words = sorted({w for w in words if typed and w.startswith(typed)})
        self.word = typed if self.words and word_bias > 0 else None  # the word so far
        self.word_bias = word_bias
        self._unlikely: dict[tuple[str, str, torch.device], torch.Tensor] = {}

    @property
    def opening(self) -> list[int]:
        """The token the target almost surely writes first, drafted for free: after typed
        indentation, the longest piece that leaves one space, as the tokenizer writes a line
        ("\n       " + " if" for 8 spaces). Verified like any draft: only speed rides on it."""
        if not self.indent or not self.rest:
            return []
        n = self.vocab.longest_prefix(self.rest)
        return self.vocab.ids_of(self.rest[:n])[:1] if n == len(self.rest) - 1 else []

    def allowed(self, rest: str, device: torch.device | str = "cpu") -> torch.Tensor:
        return self.vocab.allowed(rest, self.indent, device)

    @property
    def stuck(self) -> bool:
        """No token can re-type what is left (a caller backed up over a byte-piece character):
        the generation must end, as a row of -inf scores has no greedy pick and no distribution."""
        return bool(self.rest) and not self.vocab.retypeable(self.rest, self.indent)

    def mask(self, logits: torch.Tensor, drafted: list[int]) -> torch.Tensor:
        """logits [K+1, V]: row i (the token after drafted[:i]) keeps only allowed tokens, and
        while the cursor's word is unfinished, those that keep it one of `words` gain on the rest."""
        rest, word, out = self.rest, self.word, logits
        for i in range(len(drafted) + 1):
            if not rest and word is None:
                break
            if out is logits:
                out = logits.clone()
            if rest:
                out[i].masked_fill_(~self.allowed(rest, logits.device), float("-inf"))
            if word is not None:
                out[i] -= self.word_bias * self.unlikely(rest, word, logits.device)
            if i < len(drafted):
                rest, word = self._after(rest, word, drafted[i])
                if rest is None:
                    break  # drafted[i] is masked out, so it is rejected: later rows never count
        return out

    def accept(self, tokens: list[int]) -> None:
        for t in tokens:
            if self.rest or self.word is not None:
                rest, self.word = self._after(self.rest, self.word, t)
                self.rest = rest or ""

    def _after(self, rest: str, word: str | None, token: int) -> tuple[str | None, str | None]:
        """(rest, word) after `token`: rest None when the token breaks the constraint; word None
        once the word is finished (a token goes on past it)."""
        text = self.vocab.texts[token]
        if rest:
            left = self.vocab.advance(rest, token, self.indent)
            if left is None:
                return None, None
            if left:
                return left, word
            text = text[len(rest):]
        if word is None or not text:
            return "", word
        if _WORD_CHARS.match(text).end() < len(text):
            return "", None  # the word is finished
        word += text
        at = bisect.bisect_left(self.words, word)
        leads = at < len(self.words) and self.words[at].startswith(word)
        return "", word if leads else None  # none of them any more: nothing to lean to

    def unlikely(self, rest: str, word: str, device: torch.device | str = "cpu") -> torch.Tensor:
        """[V] bool on `device`: the tokens after which the cursor's word can no longer be one of
        `words`. Kept per device, as HealVocab keeps its masks: a verify forward asks every step."""
        key = (rest, word, torch.device(device))
        if key not in self._unlikely:
            on_cpu = (rest, word, torch.device("cpu"))
            if on_cpu not in self._unlikely:
                mask = numpy.ones(len(self.vocab.texts), dtype=bool)  # numpy: see HealVocab.allowed
                names = [w for w in self.words if w.startswith(word)]
                mask[self.vocab.word_keeping(rest, word, names)] = False
                self._unlikely[on_cpu] = torch.from_numpy(mask)
            self._unlikely[key] = self._unlikely[on_cpu].to(key[2])
        return self._unlikely[key]


# One HealVocab per backend, kept while the backend lives: its masks are reused across requests.
_VOCABS: "weakref.WeakKeyDictionary[Any, HealVocab]" = weakref.WeakKeyDictionary()


def vocab_of(backend: Any) -> HealVocab:
    """The HealVocab of `backend`'s ids (its `token_texts`), made on first use."""
    vocab = _VOCABS.get(backend)
    if vocab is None:
        vocab = _VOCABS[backend] = HealVocab(backend.token_texts)
    return vocab


def healing(backend: Any, heal: str, words: Iterable[str] = (), word_bias: float = WORD_BIAS
            ) -> Heal | None:
    """The constraint `backend.generate(constraint=...)` applies for `heal` (None: nothing to heal)."""
    return Heal(vocab_of(backend), heal, words, word_bias) if heal else None
