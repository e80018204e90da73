"""The typing-through cache: suggestions already made, answered again with no model call.

Promises:
- A suggestion comes back only for the text the model saw: the whole prompt window around the
  cursor (the prefix from the prompt's cut, the suffix the answer was post-processed against)
  must be unchanged, so an edit anywhere inside the prompt asks the model again. The owner
  (the scheduler) empties it when the model or the settings change.
- The same place asked again is one dict lookup ("repeat"); typing the start of a suggestion
  answers its rest ("typing_through"). Lookups hash the prompt's window, bounded by the
  prompt's budget, so a 1 MB document costs what a small one does.
- Typing an opener the editor closes (`(` → `()`, `"` → `""`): the rest still comes back. Where
  it ends with those closers it stops before them; where it goes on past them the hit says how
  many characters right of the cursor it replaces (`replace`), and accepting it leaves exactly
  the suggested text.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import NamedTuple

from cachetools import LRUCache

PREFIX_KEY_CHARS = 4096   # text before the cursor that indexes a cached suggestion
SUFFIX_KEY_CHARS = 512    # text after it
_CLOSERS = ")]}\"'`"      # what editors insert right of the cursor when an opener is typed


class Hit(NamedTuple):
    text: str
    status: str       # "repeat" | "typing_through"
    replace: int = 0  # characters right of the cursor the text replaces (closers typed over)


@dataclass(frozen=True)
class _Entry:
    offset: int
    text: str
    before_len: int   # the window checked before the place it was made at
    before: int       # hash(source[offset - before_len:offset])
    after_len: int
    after: int        # hash(source[offset:offset + after_len])


class CompletionCache:
    """Recent suggestions by document; `put` records the prompt window each was made under."""

    def __init__(self, maxsize: int = 256, per_document: int = 8) -> None:
        self._lru: LRUCache = LRUCache(maxsize)
        self._recent: dict[str, deque] = {}
        self._per_document = per_document

    @staticmethod
    def _key(uri: str, source: str, offset: int) -> tuple:
        return (uri, hash(source[max(0, offset - PREFIX_KEY_CHARS):offset]),
                hash(source[offset:offset + SUFFIX_KEY_CHARS]))

    def put(self, uri: str, source: str, offset: int, text: str, *,
            prompt_start: int | None = None, prompt_suffix_chars: int = 0) -> None:
        """`prompt_start`: the document offset the prompt's prefix began at; with
        `prompt_suffix_chars`, the window whose edits make this suggestion stale."""
        start = max(0, offset - PREFIX_KEY_CHARS)
        if prompt_start is not None:
            start = max(0, min(start, prompt_start))
        after_len = max(SUFFIX_KEY_CHARS, prompt_suffix_chars)
        entry = _Entry(offset, text, offset - start, hash(source[start:offset]), after_len,
                       hash(source[offset:offset + after_len]))
        key = self._key(uri, source, offset)
        self._lru[key] = entry
        recent = self._recent.setdefault(uri, deque(maxlen=self._per_document))
        if key in recent:
            recent.remove(key)
        recent.append(key)

    def get(self, uri: str, source: str, offset: int) -> Hit | None:
        hit = self._lru.get(self._key(uri, source, offset))
        if hit is not None and _same_window(hit, source, offset, offset):
            return Hit(hit.text, "repeat")
        right = source[offset:offset + 8]
        run = len(right) - len(right.lstrip(_CLOSERS))
        for key in reversed(self._recent.get(uri, ())):
            entry = self._lru.get(key)
            if entry is None or not entry.text or entry.offset >= offset:
                continue
            typed = source[entry.offset:offset]
            if len(typed) >= len(entry.text) or not entry.text.startswith(typed):
                continue
            # The text right of the cursor may have grown by closers the editor inserted.
            closers = next((k for k in range(run, -1, -1)
                            if _same_window(entry, source, entry.offset, offset + k)), None)
            if closers is None:
                continue
            if (found := _through(entry.text[len(typed):], source[offset:offset + closers])):
                return found
        return None

    def forget(self, uri: str) -> None:
        for key in self._recent.pop(uri, ()):
            self._lru.pop(key, None)

    def clear(self) -> None:
        self._lru.clear()
        self._recent.clear()


def _same_window(entry: _Entry, source: str, made_at: int, after: int) -> bool:
    """The text the suggestion was made under is unchanged: before `made_at` (where it was
    made, here) and from `after` on (the cursor, past any closers the editor inserted)."""
    if made_at < entry.before_len:
        return False
    return (hash(source[after:after + entry.after_len]) == entry.after
            and hash(source[made_at - entry.before_len:made_at]) == entry.before)


def _through(rest: str, auto: str) -> Hit | None:
    """The rest of a suggestion typed into, given the closers `auto` right of the cursor."""
    if not auto:
        return Hit(rest, "typing_through")
    if len(rest) <= len(auto):
        return None  # nothing left but the closers themselves
    if "\n" not in rest and rest.endswith(auto):
        # Shown up to the closers: accepting leaves exactly the suggested text, in any client.
        return Hit(rest[:-len(auto)], "typing_through")
    if _in_order(auto, rest.split("\n", 1)[0]):
        # It goes on past them: it replaces them, and editors show it around them.
        return Hit(rest, "typing_through", replace=len(auto))
    return None


def _in_order(chars: str, text: str) -> bool:
    it = iter(text)
    return all(c in it for c in chars)
