"""Draft sources behind one small interface.

A drafter proposes up to k next tokens after `tokens` (prompt + accepted output); the target
then verifies them. Two sources:
  NgramDrafter  prompt lookup: when the last few tokens occurred before (in this file or the
                other open buffers), propose what followed them then. Costs a dict lookup; code
                repeats itself (names, call patterns, boilerplate), so it is often right.
  ModelDrafter  the small draft model, with its own KV cache kept in step with the accepted
                tokens and its own cross-request prefix cache.
"Both" is not a third class: the engine asks the sources in turn, each with its own adaptive K;
greedy steps verify every proposal at once as a token tree, sampling steps the first one
(speculative.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch
from transformers import PreTrainedModel

from codespec_lsp.engine import hf
from codespec_lsp.engine.api import CancelToken, cancel_check
from codespec_lsp.engine.kvcache import KV, PrefixCache, common_prefix_len
from codespec_lsp.engine.speculative import adjust_probs, sample


@dataclass
class Sampling:
    temperature: float
    top_p: float
    generator: torch.Generator | None = None


@dataclass
class Proposal:
    tokens: list[int]
    probs: torch.Tensor | None  # [len(tokens), V] what they were drawn from; None: deterministic
    # greedy only: the drafter's runner-up first tokens, each a one-token branch of the step's tree
    runners_up: list[int] = field(default_factory=list)


class Drafter(Protocol):
    name: str
    forwards: int  # draft-model forward passes so far (0 for free drafters)

    def begin(self, key: str | None, prompt: list[int], lookup: list[int],
              opening: list[int] = (), target: KV | None = None) -> None: ...
    # opening: ids expected first (a free guess); target: the target's KV for this generation

    def propose(self, tokens: list[int], k: int, sampling: Sampling | None,
                cancel: CancelToken | None) -> Proposal: ...

    def rollback(self, n: int) -> None: ...  # keep at most the first n positions of its state

    def end(self, key: str | None, tokens: list[int] | None) -> None: ...  # None: state is unusable


class NgramDrafter:
    """Prompt lookup decoding: match the longest recent suffix (max_match..min_match tokens)."""

    def __init__(self, min_match: int = 3, max_match: int = 5, name: str = "ngram") -> None:
        self.min_match, self.max_match, self.name = min_match, max_match, name
        self.forwards = 0
        self._reference: list[int] = []
        self._reference_index: dict[tuple[int, ...], int] = {}
        self._index: dict[tuple[int, ...], int] = {}
        self._indexed = 0
        self._opening: list[int] = []
        self._prompt_len = 0

    def _extend_index(self, index: dict, seq: list[int], start: int, stop: int) -> None:
        # index[ngram] = position right after its latest occurrence that still has a continuation
        for end in range(max(start, 1), stop):
            for n in range(self.min_match, self.max_match + 1):
                if end - n >= 0:
                    index[tuple(seq[end - n:end])] = end

    def begin(self, key: str | None, prompt: list[int], lookup: list[int],
              opening: list[int] = (), target: KV | None = None) -> None:
        self._index, self._indexed = {}, 0
        self._opening, self._prompt_len = list(opening), len(prompt)
        if lookup != self._reference:
            self._reference, self._reference_index = list(lookup), {}
            self._extend_index(self._reference_index, self._reference, 0, len(self._reference))

    def propose(self, tokens: list[int], k: int, sampling: Sampling | None = None,
                cancel: CancelToken | None = None) -> Proposal:
        self._extend_index(self._index, tokens, self._indexed, len(tokens))
        self._indexed = len(tokens)  # the current suffix has no continuation yet: not indexed, no self-match
        # Nothing generated yet: the opening first, then what followed it before in the file.
        opening = self._opening[:k] if self._opening and len(tokens) == self._prompt_len else []
        return Proposal(opening + self._lookup(tokens, tokens + opening, k - len(opening)), None)

    def _lookup(self, tokens: list[int], ending: list[int], k: int) -> list[int]:
        """What followed the latest earlier occurrence of the longest suffix of `ending` (the
        tokens, or the tokens and the opening) in `tokens` or the lookup text, up to k tokens."""
        if k <= 0:
            return []
        for n in range(self.max_match, self.min_match - 1, -1):
            if len(ending) < n:
                continue
            key = tuple(ending[-n:])
            for seq, index in ((tokens, self._index), (self._reference, self._reference_index)):
                start = index.get(key)
                if start is not None:
                    return seq[start:start + k]
        return []

    def rollback(self, n: int) -> None:
        pass  # the index only holds positions with a continuation: nothing past the prompt lies

    def end(self, key: str | None, tokens: list[int] | None) -> None:
        pass


class ModelDrafter:
    """The draft model over its own KV. Each propose first catches its KV up with the tokens the
    target accepted (or the n-gram source supplied) since its last step, riding along with its
    first draft forward, then drafts one token per forward."""

    name = "model"

    def __init__(self, model: PreTrainedModel, prefix_cache: PrefixCache, vocab_size: int,
                 prefill_chunk: int = 256) -> None:
        self.model = model
        self.prefix_cache = prefix_cache
        self.vocab_size = vocab_size
        self.prefill_chunk = prefill_chunk
        self.forwards = 0
        self.kv: KV | None = None

    def begin(self, key: str | None, prompt: list[int], lookup: list[int],
              opening: list[int] = (), target: KV | None = None) -> None:
        self.kv = self.prefix_cache.acquire(key, prompt)  # it drafts its own opening

    def clear(self) -> None:
        self.prefix_cache.clear()

    def enable_cache(self, enabled: bool) -> None:
        self.prefix_cache.enabled = enabled

    def catch_up(self, tokens: list[int], upto: int, cancel: CancelToken | None = None) -> bool:
        """Bring the KV up to `tokens[:upto]` (the prompt the target just prefilled), in
        cancellable chunks; False when cancelled. The engine calls it after the target's prefill,
        as it does the EAGLE head's: a new prompt's catch-up is prefill work, and counted as the
        first step's drafting it made the draft's seconds a token look many times dearer."""
        kv = self.kv
        kv.crop(min(common_prefix_len(kv.ids, tokens), len(tokens) - 1))
        todo = tokens[len(kv):upto]
        self.forwards += -(-len(todo) // self.prefill_chunk)
        return kv.prefill(todo, self.prefill_chunk, cancel_check(cancel))

    def propose(self, tokens: list[int], k: int, sampling: Sampling | None,
                cancel: CancelToken | None) -> Proposal:
        kv = self.kv
        is_cancelled = cancel_check(cancel)
        # Only a long catch-up (a new prompt the prefill did not bring) runs on its own; the rest
        # rides with the first draft forward, so a step costs k draft forwards, not k + 1.
        if not self.catch_up(tokens, len(tokens) - self.prefill_chunk, cancel):
            return Proposal([], None)
        feed, drafted, probs = tokens[len(kv):], [], []
        for _ in range(k):
            if is_cancelled():
                break
            try:
                logits = kv.extend(feed)[-1, :self.vocab_size]
            except hf.ForwardCancelled:
                break  # rolled back to before this forward: kv.ids still match its cache
            self.forwards += 1
            if sampling is None:
                token = int(logits.argmax())
            else:
                q = adjust_probs(logits, sampling.temperature, sampling.top_p)
                token = sample(q, sampling.generator)
                probs.append(q)
            drafted.append(token)
            feed = [token]
        return Proposal(drafted, torch.stack(probs) if probs else None)

    def rollback(self, n: int) -> None:
        if self.kv is not None:
            self.kv.crop(min(n, len(self.kv)))

    def end(self, key: str | None, tokens: list[int] | None) -> None:
        if self.kv is not None and tokens is not None:
            # Keep only what the target accepted; rejected drafts would just be cropped next time.
            self.kv.crop(common_prefix_len(self.kv.ids, tokens))
            self.prefix_cache.release(key, self.kv)
        self.kv = None
