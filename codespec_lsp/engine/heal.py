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
"""

from __future__ import annotations

import re

import torch
from cachetools import LRUCache

_WORD = re.compile(r"\w")
MASKS_KEPT = 64  # (rest, indent, device) masks kept; a [V] bool mask each (32 KB at 32,000 ids)


def token_texts(tokenizer, vocab_size: int) -> list[str]:
    """Each id's text as it reads after other text (decoders such as CodeLlama's strip the leading
    space of a text's first token, so every id is decoded behind a context id). Special tokens and
    incomplete UTF-8 pieces read as "" and are never allowed while healing."""
    context = tokenizer.encode("a", add_special_tokens=False)[-1:]
    head = tokenizer.decode(context, skip_special_tokens=True)
    texts = tokenizer.batch_decode([context + [i] for i in range(vocab_size)], skip_special_tokens=True)
    return [t[len(head):] if t.startswith(head) and "\ufffd" not in t else "" for t in texts]


def advance(rest: str, text: str, indent: bool = False, longest: int = 0) -> str | None:
    """What is left of `rest` after a token reading `text`; None when the token breaks it.
    indent: `rest` ends the typed indentation, which the token may not lengthen.
    longest: the length of the longest text in the vocabulary that is a proper prefix of `rest`.
    A token covering only part of `rest` and stopping inside a word must be that longest one:
    " f" + "eatures" is a split the model never saw in training (the tokenizer writes
    " feature" + "s"), and a model led into it writes words like "featuresh"."""
    if text.startswith(rest):
        return None if indent and text[len(rest):len(rest) + 1] in (" ", "\t") else ""
    if text and rest.startswith(text) and (len(text) == longest or not _WORD.match(rest, len(text))):
        return rest[len(text):]
    return None


class HealVocab:
    """A backend's id texts and the allowed-token masks read from them. A mask is a pass over the
    whole vocabulary (~13 ms in Python at 32,000 ids), and keystrokes in one word or after one
    indentation heal the same text again and again, so masks are kept across requests, and on
    the device the logits live on (a GPU step would otherwise copy the mask there each time)."""

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts
        self._texts_set = set(texts)
        self._masks: LRUCache = LRUCache(maxsize=MASKS_KEPT)

    def allowed(self, rest: str, indent: bool, device: torch.device | str = "cpu") -> torch.Tensor:
        """[V] bool on `device`: the ids a token may take while `rest` is still to be re-typed."""
        key = (rest, indent, torch.device(device))
        if key not in self._masks:
            on_cpu = (rest, indent, torch.device("cpu"))
            if on_cpu not in self._masks:
                longest = self.longest_prefix(rest)
                self._masks[on_cpu] = torch.tensor([advance(rest, t, indent, longest) is not None
                                                    for t in self.texts])
            self._masks[key] = self._masks[on_cpu].to(key[2])
        return self._masks[key]

    def longest_prefix(self, rest: str) -> int:
        """Length of the longest id text that is a proper prefix of `rest` (0: none)."""
        return max((n for n in range(len(rest) - 1, 0, -1) if rest[:n] in self._texts_set), default=0)

    def advance(self, rest: str, token: int, indent: bool) -> str | None:
        return advance(rest, self.texts[token], indent, self.longest_prefix(rest))


class Heal:
    """The constraint for one generation: `rest` is the part of `heal` not yet generated."""

    def __init__(self, vocab: HealVocab, heal: str) -> None:
        self.vocab, self.rest = vocab, heal
        tail = heal.rsplit("\n", 1)[-1]
        self.indent = bool(tail) and not tail.strip()  # the cursor is right after indentation

    def allowed(self, rest: str, device: torch.device | str = "cpu") -> torch.Tensor:
        return self.vocab.allowed(rest, self.indent, device)

    def mask(self, logits: torch.Tensor, drafted: list[int]) -> torch.Tensor:
        """logits [K+1, V]: row i (the token after drafted[:i]) keeps only allowed tokens."""
        rest, out = self.rest, logits
        for i in range(len(drafted) + 1):
            if not rest:
                break
            if out is logits:
                out = logits.clone()
            out[i].masked_fill_(~self.allowed(rest, logits.device), float("-inf"))
            if i < len(drafted):
                rest = self.vocab.advance(rest, drafted[i], self.indent)
                if rest is None:
                    break  # drafted[i] is masked out, so it is rejected: later rows never count
        return out

    def accept(self, tokens: list[int]) -> None:
        for t in tokens:
            if self.rest:
                self.rest = self.vocab.advance(self.rest, t, self.indent) or ""
