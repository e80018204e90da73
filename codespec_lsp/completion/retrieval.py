"""Code like the lines being written, from the workspace's other files (RepoCoder-style windows).

The definitions of imported names (workspace.py) say what a name takes; the lines of other files
that call it say how this project writes the call. CrossCodeEval retrieves windows of the other
files of a repository most like the lines above the cursor; Copilot ranks windows of the open
tabs the same way. Those tabs, in an editor, are mostly the modules a file imports from, which
define the names rather than use them (Jaccard windows of them measured worse than nothing on
smol: see docs/context.md), so here the candidates are the open documents and the `.py` files
beside the current one (the likeliest to use the same names), read through WorkspaceSource's
bounds.

Promises:
- A window is WINDOW_LINES lines at every STRIDE-th line of a candidate file; its score is the
  Jaccard similarity of its identifiers and those of the QUERY_LINES lines above the cursor.
- The current file is never a candidate (its text is already in the prompt); windows under
  MIN_SIMILARITY are not shown; at most one window per file.
- Called once per prompt cut; knows nothing of tokens.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

from cachetools import LRUCache

from codespec_lsp.completion.workspace import TIME_BUDGET_S, Budget, WorkspaceSource

WINDOW_LINES = 12
STRIDE = 4
QUERY_LINES = 10
# Chosen on the tuning packages: every window that won a name or a line scored 0.32 or more;
# those under 0.3 only cost similarity (docs/context.md).
MIN_SIMILARITY = 0.3
FOLDER_FILES = 24   # files beside the current one read, at most
_WORD = re.compile(r"[A-Za-z_]\w*")


@dataclass(frozen=True)
class Window:
    path: Path
    line: int        # 0-based line of the file the window starts at
    text: str
    similarity: float


def words(text: str) -> frozenset[str]:
    return frozenset(_WORD.findall(text))


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 0.0


def windows_of(text: str) -> list[tuple[int, frozenset[str]]]:
    """(first line, identifiers) of each window of `text`; blank ones left out."""
    lines = text.splitlines()
    out = []
    for start in range(0, max(len(lines) - WINDOW_LINES, 0) + 1, STRIDE):
        chunk = "\n".join(lines[start:start + WINDOW_LINES])
        if chunk.strip():
            out.append((start, words(chunk)))
    return out


# A file's windows by WorkspaceSource.read's key (which changes with the text), as many files as
# one cut reads (the server sends at most 8 open documents): a re-cut only scores them.
_windows: LRUCache = LRUCache(maxsize=FOLDER_FILES + 8)


def best_window(path: Path, key: tuple, text: str, query: frozenset[str]) -> Window | None:
    """The window of `text` most like `query` (the first of equals), None when none reaches
    MIN_SIMILARITY: most files do not, and their text is then never cut into lines."""
    if key not in _windows:
        _windows[key] = windows_of(text)
    scored = [(jaccard(chunk_words, query), start) for start, chunk_words in _windows[key]]
    if not scored:
        return None
    score, start = max(scored, key=lambda s: s[0])  # max keeps the first of equals
    if score < MIN_SIMILARITY:
        return None
    return Window(path, start, "\n".join(text.splitlines()[start:start + WINDOW_LINES]), score)


def query_words(prefix: str) -> frozenset[str]:
    """The identifiers of the QUERY_LINES lines above the cursor: what a candidate is scored on."""
    return words("\n".join(prefix.splitlines()[-QUERY_LINES:]))


def most_similar(prefix: str, chunks: list[tuple[str, str]], limit: int) -> list[tuple[str, str]]:
    """Up to `limit` of (name, text) `chunks`, the most like the lines above the cursor first
    (the first of equals first); no floor: the recently edited chunks a user just wrote."""
    query = query_words(prefix)
    return sorted(chunks, key=lambda c: -jaccard(words(c[1]), query))[:limit]


def similar_windows(source: WorkspaceSource, prefix: str, current: Path | None,
                    open_docs: dict[Path, str], limit: int) -> list[Window]:
    """Up to `limit` windows, one per file, the most like the lines above the cursor first."""
    query = query_words(prefix)
    if not query:
        return []
    budget = Budget(time.monotonic() + TIME_BUDGET_S)
    candidates = list(open_docs)
    if current is not None:
        candidates += source.python_files(current.parent, FOLDER_FILES)
    found = []
    for path in dict.fromkeys(candidates):
        if path == current or (read := source.read(path, open_docs, budget)) is None:
            continue
        window = best_window(path, *read, query)
        if window is not None:
            found.append(window)
    return sorted(found, key=lambda w: -w.similarity)[:limit]
