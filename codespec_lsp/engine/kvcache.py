"""Cross-request KV prefix cache for one model, bounded in bytes.

Contract: `acquire(tokens)` hands out the cached sequence sharing the longest token prefix with
`tokens`, cropped to that prefix (and always short of the last token, so the caller has at least
one token to run and gets logits). A prefix shorter than MIN_REUSE tokens and than half the entry
starts cold instead, leaving that entry to its own file. The caller owns it until `release(tokens, cache)` puts it back
under the tokens it now really holds. Several sequences are kept, because the user moves between
files; the least recently used go first once their tensors exceed `max_bytes`.

A sequence is handed out, not copied: copying KV per keystroke would cost more than it saves, and
the entry it came from is the one the new request extends.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from cachetools import LRUCache
from transformers import DynamicCache, PreTrainedModel

from codespec_lsp.engine import hf

# Taking an entry crops it, so a short shared head (BOS, a common import block) must not cost
# another file its cache: an entry is reused only for a prefix this long or half its length.
MIN_REUSE = 32


@dataclass
class _Entry:
    tokens: torch.Tensor  # int64 ids, kept as a tensor: every request compares against every entry
    cache: DynamicCache
    nbytes: int


def _as_tensor(tokens) -> torch.Tensor:
    return tokens if isinstance(tokens, torch.Tensor) else torch.tensor(tokens, dtype=torch.long)


def common_prefix_len(a, b) -> int:
    a, b = _as_tensor(a), _as_tensor(b)
    n = min(len(a), len(b))
    if n == 0:
        return 0
    mismatch = (a[:n] != b[:n]).nonzero()
    return int(mismatch[0]) if len(mismatch) else n


class PrefixCache:
    def __init__(self, model: PreTrainedModel, max_bytes: int, enabled: bool = True) -> None:
        self.model = model
        self.enabled = enabled
        self.max_bytes = max_bytes
        self._entries: LRUCache = LRUCache(maxsize=max_bytes, getsizeof=lambda e: e.nbytes)
        self._ids = itertools.count()

    def acquire(self, tokens: list[int]) -> tuple[DynamicCache, int]:
        """Returns (cache, reused): the cache holds exactly tokens[:reused], reused < len(tokens)."""
        best_key, best_len = None, 0
        wanted = _as_tensor(tokens)
        if self.enabled:
            for key, entry in self._entries.items():
                n = common_prefix_len(entry.tokens, wanted)
                if n > best_len and (n >= MIN_REUSE or 2 * n >= len(entry.tokens)):
                    best_key, best_len = key, n
        if best_key is None:
            return hf.new_cache(self.model), 0
        entry = self._entries.pop(best_key)
        reused = min(best_len, len(tokens) - 1, hf.cache_len(entry.cache))
        hf.crop(entry.cache, reused)
        return entry.cache, reused

    def release(self, tokens: list[int], cache: DynamicCache) -> None:
        """Keep `cache`, which holds the KV of `tokens[:cache_len(cache)]`, for later requests."""
        if not self.enabled:
            return
        hf.crop(cache, len(tokens))  # tokens after an EOS or a failure are not kept
        held = hf.cache_len(cache)
        if held == 0:
            return
        entry = _Entry(_as_tensor(tokens[:held]), cache, hf.cache_nbytes(cache))
        if entry.nbytes > self.max_bytes:
            return  # larger than the whole budget: keeping it would evict everything else
        self._entries[next(self._ids)] = entry

    def clear(self) -> None:
        self._entries.clear()

    @property
    def nbytes(self) -> int:
        return int(self._entries.currsize)

    def __len__(self) -> int:
        return len(self._entries)
