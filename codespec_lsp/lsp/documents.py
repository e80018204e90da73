"""The document model: the server's copy of an open document equals the editor's.

pygls keeps the documents (incremental sync applied before any handler runs); this module
only corrects how pygls reads them, by subclassing its TextDocument and Workspace.

Promises (LSP 3.17, "Text Documents" and "Position"):
- Lines end at "\\n", "\\r\\n" or "\\r" only. pygls splits with `str.splitlines`, which also
  breaks at \\f, \\v, U+001C-U+001E, U+0085 and U+2028/9, so positions after such a character
  landed on the wrong line.
- Positions count in the negotiated encoding (UTF-16 unless the client offered better). A
  character past the end of its line means the line end (the spec's rule; pygls stopped one
  character short), a line past the last means the end of the document. A position inside a
  surrogate pair means after the pair.
- A change whose range is reversed (end before start) is applied to the normalised range.
- A change older than the document (its version is lower) is logged and dropped: the newest
  text stays. A change for a document that is not open is logged and dropped.
- Each document keeps the line spans its changes touched, most recent last, shifted as lines
  are added or removed above them (`Document.edited`); `edited_chunks` gives the text of the
  most recent across the other documents, for workspace context (completion/context.py).
"""

from __future__ import annotations

import bisect
import itertools
import logging
import re
from collections.abc import Iterable, Sequence
from urllib.parse import unquote

from lsprotocol import types
from pygls.workspace import TextDocument
from pygls.workspace import Workspace as _PyglsWorkspace

log = logging.getLogger("codespec_lsp.lsp.documents")

_BREAK = re.compile(r"\r\n|\r|\n")
_SURROGATE = re.compile(r"[\ud800-\udfff]")
_TRAILING_BREAK = re.compile(r"(\r\n|\r|\n)\Z")
# Edited spans kept per document, and the lines of one shown (one line of code around it too):
# what the history bench measured (benchmarks/context/edits.py, docs/context.md).
MAX_EDITED_SPANS = 8
EDITED_CHUNK_LINES = 16
_edit_order = itertools.count()  # recency across documents


def split_lines(text: str) -> list[str]:
    """Lines with their line breaks, like `str.splitlines(True)` but at LSP breaks only."""
    lines, start = [], 0
    for m in _BREAK.finditer(text):
        lines.append(text[start:m.end()])
        start = m.end()
    if start < len(text):
        lines.append(text[start:])
    return lines


def clean(text: str) -> str:
    """`text` with lone surrogates replaced by U+FFFD, one for one (offsets stay valid).

    JSON lets a client send "\\ud800"; a tokenizer cannot encode it, so text headed for the model
    passes through here, every open document on every request: the check is an encode (0.07 ms
    a MB; a regex search took 2.7), the copy only when one is there.
    """
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)


class Document(TextDocument):
    """A pygls TextDocument that splits lines and resolves positions the LSP way, and keeps the
    line spans its changes touched."""

    _cache: tuple[str, list[int], tuple[str, ...] | None] | None = None

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # [first line, last line, order] of each span changes touched, oldest first.
        self.edited: list[list[int]] = []

    def _index(self) -> tuple[str, list[int]]:
        """The source and its line start offsets, cached until the source changes."""
        source = self.source
        if self._cache is None or self._cache[0] is not source:
            # After a final line break starts an empty line: (n, 0) is the end, a real place.
            starts = [0] + [m.end() for m in _BREAK.finditer(source)]
            self._cache = (source, starts, None)
        return self._cache[0], self._cache[1]

    @property
    def lines(self) -> tuple[str, ...]:  # type: ignore[override]
        source, starts = self._index()
        assert self._cache is not None
        if self._cache[2] is None:
            self._cache = (source, starts, tuple(split_lines(source)))
        return self._cache[2]  # type: ignore[return-value]

    def offset_at(self, position: types.Position, *, strict: bool = False) -> int | None:
        """Code-point offset of a client position.

        Clamped to the line end / document end unless `strict`, where a position past the end
        of its line or of the document is None. The empty line after a final line break is a
        real place: (n, 0) there is the end of the document, not past it.
        """
        source, starts = self._index()
        line, char = max(0, position.line), max(0, position.character)
        if line >= len(starts):
            return None if strict else len(source)
        start = starts[line]
        end = starts[line + 1] if line + 1 < len(starts) else len(source)
        m = _BREAK.search(source, start, end)
        body_end = m.start() if m else end
        column = self._column(source, start, body_end, char)
        if column is None:
            return None if strict else body_end
        return column

    def _column(self, source: str, start: int, end: int, units: int) -> int | None:
        """Offset in source[start:end] that lies `units` client code units in; None if beyond."""
        if units == 0:
            return start
        counter = self.position_codec.impl
        if self.position_codec.encoding == types.PositionEncodingKind.Utf32 or \
                source.isascii():
            return start + units if start + units <= end else None
        seen = 0
        for i in range(start, end):
            seen += counter.code_units_for_char(source[i])
            if seen >= units:
                return i + 1  # inside a surrogate pair (or a UTF-8 sequence): after the char
        return None

    def position_at(self, offset: int) -> types.Position:
        """The client position of a code-point offset."""
        source, starts = self._index()
        offset = min(max(0, offset), len(source))
        line = bisect.bisect_right(starts, offset) - 1
        start = starts[line]
        if (m := _BREAK.search(source, start, offset)) is not None:
            offset = m.start()  # inside a "\r\n": the line end
        return types.Position(line=line, character=self.position_codec.client_num_units(
            source[start:offset]))

    def apply_change(self, change: types.TextDocumentContentChangeEvent) -> None:
        old = self.source
        super().apply_change(change)
        if self.source != old:  # a change that leaves the text as it was touches nothing
            self._record_edit(old, self.source)

    def _record_edit(self, old: str, new: str) -> None:
        """Keep the lines the change from `old` to `new` touched, found by the text both share
        at each end (the same for a whole-document change as for a range); spans below it move
        with the lines added or removed, spans it touches join it."""
        start = _common_prefix(old, new)
        tail = _common_suffix(old, new, min(len(old), len(new)) - start)
        first = _breaks(old, 0, start)
        old_last, old_breaks = _last_line(old, start, len(old) - tail, first)
        new_last, new_breaks = _last_line(new, start, len(new) - tail, first)
        shift = new_breaks - old_breaks
        span = [first, new_last, next(_edit_order)]
        kept = []
        for a, b, order in self.edited:
            if b < first - 1:
                kept.append([a, b, order])
            elif a > old_last + 1:
                kept.append([a + shift, b + shift, order])
            else:  # touching: one span, as recent as this change
                span[0], span[1] = min(span[0], a), max(span[1], b + shift if b > old_last else new_last)
        self.edited = (kept + [span])[-MAX_EDITED_SPANS:]

    def _apply_incremental_change(self, change: types.TextDocumentContentChangePartial) -> None:
        start = self.offset_at(change.range.start)
        end = self.offset_at(change.range.end)
        assert start is not None and end is not None
        if end < start:
            log.warning("%s: reversed range %s in a change: applied as %s..%s", self.uri,
                        _fmt(change.range), _fmt_pos(change.range.end),
                        _fmt_pos(change.range.start))
            start, end = end, start
        source = self.source
        self._source = source[:start] + change.text + source[end:]


def _last_line(text: str, start: int, end: int, first: int) -> tuple[int, int]:
    """(the last line text[start:end] touches, starting on line `first`; the breaks it holds).
    A region that ends with its line break does not touch the line after it."""
    breaks = _breaks(text, start, end)
    return first + max(breaks - (end > start and text[end - 1] in "\r\n"), 0), breaks


def _breaks(text: str, start: int, end: int) -> int:
    """The line breaks in text[start:end], "\\r\\n" one, a lone "\\r" one (str.count, not a
    regex: this runs on every change of documents of any size)."""
    lf = text.count("\n", start, end)
    if "\r" not in text:
        return lf
    return lf + text.count("\r", start, end) - text.count("\r\n", start, end)


def _common_prefix(a: str, b: str) -> int:
    """len of the longest common prefix: string compares in halving steps, not a loop per char."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _common_suffix(a: str, b: str, limit: int) -> int:
    """len of the longest common suffix, at most `limit`: the halving steps of _common_prefix."""
    lo, hi = 0, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[len(a) - mid:len(a) - lo] == b[len(b) - mid:len(b) - lo]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def edited_chunks(docs: Iterable[Document], limit: int = MAX_EDITED_SPANS) -> list[tuple[str, str]]:
    """(uri, text) of the `limit` most recently edited spans of `docs`, the most recent first:
    the span's lines (at most EDITED_CHUNK_LINES of them) and the line above and below."""
    spans = sorted(((order, a, b, doc) for doc in docs for a, b, order in doc.edited),
                   key=lambda s: -s[0])[:limit]
    out = []
    for _, a, b, doc in spans:
        chunk = span_text(doc.lines, a, b)  # lines are kept until the document changes
        if chunk.strip():
            out.append((doc.uri, chunk))
    return out


def span_text(lines: Sequence[str], first: int, last: int) -> str:
    """Lines first..last (at most EDITED_CHUNK_LINES of them) and one either side, of `lines`
    as split_lines gives them (with their breaks); the last break left out."""
    shown = "".join(lines[max(first - 1, 0):first + min(last - first + 1, EDITED_CHUNK_LINES) + 1])
    return shown[:-len(m.group())] if (m := _TRAILING_BREAK.search(shown)) else shown


def _fmt_pos(p: types.Position) -> str:
    return f"{p.line}:{p.character}"


def _fmt(r: types.Range) -> str:
    return f"{_fmt_pos(r.start)}-{_fmt_pos(r.end)}"


class Workspace(_PyglsWorkspace):
    """pygls's workspace holding `Document`s, refusing stale and orphan changes."""

    def _create_text_document(self, doc_uri: str, source: str | None = None,
                              version: int | None = None,
                              language_id: str | None = None) -> Document:
        return Document(doc_uri, source=source, version=version, language_id=language_id,
                        sync_kind=self._sync_kind, position_codec=self.position_codec)

    def update_text_document(self, text_doc: types.VersionedTextDocumentIdentifier,
                             change: types.TextDocumentContentChangeEvent) -> None:
        doc = self._text_documents.get(unquote(text_doc.uri))
        if doc is None:
            log.warning("didChange for %s, which is not open: ignored", text_doc.uri)
            return
        if text_doc.version is not None and doc.version is not None and \
                text_doc.version < doc.version:
            # Versions only grow (LSP): an older one is a reordered or replayed message.
            log.warning("%s: change for version %s after version %s: ignored (the newer text "
                        "stays)", text_doc.uri, text_doc.version, doc.version)
            return
        doc.apply_change(change)
        doc.version = text_doc.version

    @classmethod
    def like(cls, other: _PyglsWorkspace) -> "Workspace":
        """A fresh workspace with the same root, folders, sync kind and position encoding."""
        return cls(other.root_uri, other._sync_kind, list(other.folders.values()),
                   other.position_encoding)
