"""KV state: one small class (token ids + the model's cache) and the cross-request prefix cache.

`KV` holds `ids` and a transformers cache holding exactly their keys and values (gpt-fast's
"tokens plus a length": rollback is `crop`). The target, the draft-model drafter and the prefix
cache all use it, so no token list is kept in step with a cache by hand.

`PrefixCache` keeps ONE entry per document key (the URI). Contract of `acquire(key, ids)`:
- it hands out a KV holding a prefix of `ids`, always short of the last token (the caller runs
  at least one token and gets logits);
- that KV is the document's own entry (cropped to the common prefix), or, when another document's
  entry shares a longer head (a licence header, a common import block), a COPY of that head: a
  request never takes or crops another document's entry;
- the caller owns it until `release(key, kv)` stores it back as that document's entry.
Entries are bounded in bytes; the least recently used go first.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from cachetools import LRUCache
from transformers import DynamicCache, PreTrainedModel

from codespec_lsp.engine import hf

# Copying another document's head only pays when it saves more than this many tokens over the
# document's own entry (a copy moves the whole head's KV; extending our own moves nothing).
MIN_COPY_GAIN = 16


def common_prefix_len(a, b) -> int:
    a = a if isinstance(a, torch.Tensor) else torch.tensor(a, dtype=torch.long)
    b = b if isinstance(b, torch.Tensor) else torch.tensor(b, dtype=torch.long)
    n = min(len(a), len(b))
    if n == 0:
        return 0
    mismatch = (a[:n] != b[:n]).nonzero()
    return int(mismatch[0]) if len(mismatch) else n


class KV:
    """Token ids and the model's KV for exactly those ids."""

    def __init__(self, model: PreTrainedModel, ids: list[int] | None = None,
                 cache: DynamicCache | None = None, states: torch.Tensor | None = None,
                 keep_states: bool = False) -> None:
        self.model = model
        self.ids: list[int] = list(ids or [])
        self.cache = cache if cache is not None else hf.new_cache(model)
        # With keep_states, the final hidden state of every held position (an EAGLE draft reads
        # them); grown in place with spare room, so a step does not copy the whole history.
        self.keep_states = keep_states
        self._states = states

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def hidden(self) -> torch.Tensor | None:
        """[len(self), H] final hidden states, or None when not kept (or one is missing)."""
        if self._states is None or len(self._states) < len(self.ids):
            return None
        return self._states[:len(self.ids)]

    def extend(self, ids: list[int], last_only: bool = False, parents: list[int] | None = None) -> torch.Tensor:
        """Run `ids` after what is held; returns their logits [len(ids), V] ([1, V], the last
        id's, with `last_only`). A forward cancelled between layers is rolled back whole
        (hf.forward), so `ids` stay as they were. `parents`: the last len(parents) ids are a token
        tree (speculative.token_tree; -1: the id before them), each attending to its ancestors
        only; `keep` then picks the branch that stays."""
        tree = parents if parents and parents != list(range(-1, len(parents) - 1)) else None
        if not self.keep_states:
            logits = hf.forward(self.model, ids, self.cache, last_only, tree=tree)
            self.ids.extend(ids)
            return logits
        logits, states = hf.forward_with_states(self.model, ids, self.cache, last_only=last_only, tree=tree)
        held, end = len(self.ids), len(self.ids) + len(ids)
        if self._states is None or len(self._states) < held:
            self._states = None if held else states.new_empty((0, states.shape[-1]))
        if self._states is not None:
            if len(self._states) < end:
                grown = states.new_empty((max(end, 2 * len(self._states), 256), states.shape[-1]))
                grown[:held] = self._states[:held]
                self._states = grown
            self._states[held:end] = states
        self.ids.extend(ids)
        return logits

    @property
    def takes_trees(self) -> bool:
        return hf.takes_trees(self.model)

    def keep(self, start: int, rows: list[int]) -> None:
        """Keep the first `start` positions, then the positions `rows` (later ones, in order): the
        accepted branch of a token tree. A plain chain's is a crop."""
        if rows == list(range(start, start + len(rows))):
            self.crop(start + len(rows))
            return
        hf.keep_rows(self.cache, start, rows)
        if self.hidden is not None:
            with torch.inference_mode():  # the states are inference tensors (hf.forward_with_states)
                self._states[start:start + len(rows)] = self._states[rows]
        self.ids[start:] = [self.ids[r] for r in rows]

    def prefill(self, ids: list[int], chunk: int, cancelled: Callable[[], bool] = lambda: False) -> bool:
        """Extend by `ids` in chunks, checking `cancelled` between them; chunks run stay. False if cancelled."""
        for start in range(0, len(ids), chunk):
            if cancelled():
                return False
            try:
                self.extend(ids[start:start + chunk], last_only=True)
            except hf.ForwardCancelled:
                return False
        return True

    def crop(self, n: int) -> None:
        """Keep the first n positions (rollback of rejected drafts, or a prompt that branched)."""
        hf.crop(self.cache, n)
        del self.ids[n:]

    def copy(self, n: int | None = None) -> "KV":
        """An independent KV holding the first n positions (all by default)."""
        n = len(self) if n is None else n
        states = self.hidden
        return KV(self.model, self.ids[:n], hf.copy_head(self.model, self.cache, n),
                  states[:n].clone() if states is not None else None, self.keep_states)

    def reset(self) -> None:
        self.ids, self.cache, self._states = [], hf.new_cache(self.model), None

    @property
    def nbytes(self) -> int:
        states = self._states.numel() * self._states.element_size() if self._states is not None else 0
        return hf.cache_nbytes(self.cache) + states


class PrefixCache:
    def __init__(self, model: PreTrainedModel, max_bytes: int, enabled: bool = True,
                 keep_states: bool = False) -> None:
        self.model = model
        self.keep_states = keep_states  # KVs handed out keep hidden states (KV.keep_states)
        self.enabled = enabled
        self.max_bytes = max_bytes
        self._entries: LRUCache = LRUCache(maxsize=max_bytes, getsizeof=lambda kv: max(kv.nbytes, 1))

    def acquire(self, key: str | None, ids: list[int]) -> KV:
        """A KV holding a prefix of ids[:-1]: this document's entry, or a copy of a shared head."""
        if not self.enabled or not ids:
            return KV(self.model, keep_states=self.keep_states)
        limit = len(ids) - 1
        own = self._entries.pop(key, None)
        own_len = min(common_prefix_len(own.ids, ids), limit) if own is not None else 0
        donor, donor_len = None, 0
        for other in self._entries.values():
            n = min(common_prefix_len(other.ids, ids), limit)
            if n > donor_len:
                donor, donor_len = other, n
        if donor is not None and donor_len >= own_len + MIN_COPY_GAIN:
            return donor.copy(donor_len)  # the donor's entry stays whole: it is another file's
        if own is None:
            return KV(self.model, keep_states=self.keep_states)
        own.crop(own_len)
        return own

    def release(self, key: str | None, kv: KV) -> None:
        """Keep `kv` as document `key`'s entry (replacing any older one)."""
        if not self.enabled or len(kv) == 0:
            return
        if kv.nbytes > self.max_bytes:
            self._entries.pop(key, None)
            return  # larger than the whole budget: keeping it would evict everything else
        self._entries[key] = kv

    def clear(self) -> None:
        self._entries.clear()

    @property
    def nbytes(self) -> int:
        return int(self._entries.currsize)

    def __len__(self) -> int:
        return len(self._entries)
