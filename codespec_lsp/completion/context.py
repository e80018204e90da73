"""Prompt building: which part of the document the model sees, in which template.

Promises:
- The prefix fits the token budget and starts at a line boundary.
- The prompt's start is STABLE while the user types: the cut point is remembered per document
  and only moves when the prefix outgrows the budget or shrinks far below it (hysteresis). The
  engine's KV prefix cache then serves every keystroke but the rare re-cut from memory.
- With FIM tokens (CodeLlama base: `<PRE> … <SUF> … <MID>`) the suffix goes in the prompt;
  prefix-only models (the tiny pair, CodeLlama-Python) get the prefix alone. Either way the
  suffix is returned for post-processing.
- With `workspace_context`, the definitions of the names the file imports from the workspace
  (completion/workspace.py), then the window of another file most like the lines above the
  cursor (completion/retrieval.py), then what the user edited last in other documents, go
  before the prefix. They are chosen at the cut and kept
  with it, so the prompt's start still does not move while the user types; an edit elsewhere
  shows at the next cut. Nothing found: the prompt is exactly the one without context.
- While the prompt starts at the file's start, the file's path heads it as a line comment
  (`# pkg/utils.py`, _header): a new or short file then reads as code of its language.
- Knows token counts and templates, never LSP types; the token counter is injected.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

from codespec_lsp.completion.retrieval import most_similar, similar_windows
from codespec_lsp.completion.workspace import (IMPORT_STATEMENT, Definition, WorkspaceSource,
                                               import_definitions, to_path)

# Code rarely exceeds this many characters per token; it bounds how much text is ever tokenized,
# so a 1 MB document costs no more than a small one.
MAX_CHARS_PER_TOKEN = 8
# After a re-cut the prefix fills this share of the budget, leaving room to type before the next.
RECUT_FILL = 0.75
# A kept cut whose prefix fell under this share (cursor moved up, text deleted) is re-cut.
LOW_WATER = 0.5
SUFFIX_SHARE = 0.25   # of the budget, for the FIM suffix
# Of the budget, at most, for workspace definitions. Chosen with the form below by bench context
# on smol, two packages released after it was trained (docs/context.md): 0.1 found less, 0.4 took
# too much of the file (prefix kept fell by a third).
CONTEXT_SHARE = 0.25
POSTPROCESS_SUFFIX_CHARS = 2000
LOOKUP_CHARS = 200_000


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
    context: str = ""       # workspace definitions, chosen with the cut
    context_tokens: int = 0  # the context's and the header's
    at: int = 0             # document offset the context goes before (context_place), >= cut
    header: str = ""        # the file's path comment, while the prompt starts at the file's start


# Line comments by file extension, for the path comment that heads a file's own text
# (_header). An extension not listed gets no header: a wrong comment syntax reads as code.
_HASH = ("py", "pyi", "pyw", "sh", "bash", "zsh", "rb", "pl", "r", "jl", "toml", "yaml", "yml",
         "nim", "ex", "exs", "cmake", "ps1", "tf", "coffee", "cr", "mojo")
_SLASHES = ("js", "jsx", "mjs", "cjs", "ts", "tsx", "mts", "cts", "c", "h", "cc", "cpp", "cxx",
            "hpp", "hh", "hxx", "cs", "java", "kt", "kts", "go", "rs", "swift", "scala", "dart",
            "php", "zig", "v", "groovy", "gradle", "proto", "sol", "mm", "cu")
_DASHES = ("lua", "sql", "hs", "elm", "ada", "adb", "ads")
LINE_COMMENT = {**{e: "#" for e in _HASH}, **{e: "//" for e in _SLASHES},
                **{e: "--" for e in _DASHES}}


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
    workspace_context: bool = False
    # The form of the workspace context; bench context compares them (see CONTEXT_SHARE). A
    # class's fields and methods ("members") measured worse than its signature and docstring
    # line alone on smol, comments ("comment") no better than code.
    context_share: float = CONTEXT_SHARE
    context_detail: str = "signatures"  # signature, first docstring line; "members" adds a class's
    context_form: str = "code"          # as code under a path comment; "comment": every line one
    context_place: str = "top"          # before the prefix; "near": before the top-level
                                        # statement the cursor is in (fixed at the cut)
    # Windows of other files most like the lines above the cursor (retrieval.py), after the
    # definitions. One, in at most 0.15 of the budget, read best over three packages (90 points,
    # docs/context.md); two or three windows, or windows without the definitions, no better.
    # The definitions keep their share: these come out of the file's, like them.
    context_windows: int = 1
    window_share: float = 0.15
    # Spans the user edited last in other documents (given to build), the most like the lines
    # above the cursor, nearest the file. Two in 0.15 of the budget, set like the window's and
    # not tuned; measured on four repositories' histories (benchmarks/context/edits.py,
    # docs/context.md).
    edit_chunks: int = 2
    edit_share: float = 0.15
    _state: dict[str, _CutState] = field(default_factory=dict)
    _workspace: WorkspaceSource = field(default_factory=WorkspaceSource)

    def forget(self, key: str) -> None:
        self._state.pop(key, None)

    def build(self, key: str, source: str, offset: int,
              others: Sequence[tuple[str, str]] = (), roots: Sequence[str] = (),
              edits: Sequence[tuple[str, str]] = ()) -> Prompt:
        """`key`: the document's URI or path; `others`: (URI or path, text) of the other open
        documents; `roots`: the workspace folders (URIs or paths) files may be read from;
        `edits`: (URI or path, text) of spans just edited in other documents, the latest first."""
        offset = max(0, min(offset, len(source)))
        suffix_full = source[offset:offset + POSTPROCESS_SUFFIX_CHARS]
        suffix_budget = int(self.budget * SUFFIX_SHARE) if self.fim_tokens else 0

        def prefix_budget(context_tokens: int) -> int:
            return max(self.budget - suffix_budget - context_tokens, 16)

        state = self._state.get(key)
        if state is None or state.at > offset or not self._keep(state.cut, source, offset,
                                                                prefix_budget(state.context_tokens)):
            self._workspace.set_roots(roots)  # what the context reads and the paths it shows
            context = self._context(key, source, offset, others, edits) \
                if self.workspace_context else ""
            n = self.count_tokens(context) if context else 0
            header = self._header(key)
            n_header = self.count_tokens(header) if header else 0
            cut = self._recut(source, offset, prefix_budget(n + n_header))
            if cut > 0:
                header, n_header = "", 0
            at = max(cut, _statement_start(source, offset)) if self.context_place == "near" else cut
            state = self._state[key] = _CutState(cut, context, n + n_header, at, header)
        prefix = source[state.cut:offset]
        if state.at == state.cut:  # the context first, the file (headed by its path) after it
            shown = state.context + state.header + source[state.cut:offset]
        else:
            shown = state.header + source[state.cut:state.at] + state.context + \
                source[state.at:offset]

        if self.fim_tokens:
            suffix = self._fit_suffix(suffix_full, suffix_budget)
            text = fim_prompt(self.fim_tokens, shown, suffix)
        else:
            text = shown
        lookup = "\n".join(t[:LOOKUP_CHARS] for _, t in others)[:LOOKUP_CHARS]
        return Prompt(text=text, prefix=prefix, suffix=suffix_full, fim=bool(self.fim_tokens),
                      cut=state.cut, lookup_text=suffix_full + "\n" + lookup)

    def _context(self, key: str, source: str, offset: int, others: Sequence[tuple[str, str]],
                 edits: Sequence[tuple[str, str]] = ()) -> str:
        """The definitions the file imports, the likeliest next nearest the file, within
        context_share of the budget, then the retrieved windows, then the edited spans; each
        file's block headed by its path, as if it came first."""
        open_docs = {p: t for name, t in others if (p := to_path(name)) is not None}
        found = import_definitions(self._workspace, source[:offset], to_path(key), open_docs)
        after = self._windows(key, source[:offset], open_docs) + self._edited(source[:offset], edits)
        if not found:
            return after

        def shown(d: Definition) -> str:
            text = d.short if self.context_detail in ("signatures", "usages") else d.text
            if self.context_detail == "usages":
                text += "".join(f"\n# e.g. {line}" for line in _usages(d.name, others, text))
            return self._in_form(text)

        chosen, used, limit = [], 0, int(self.budget * self.context_share)
        for d in sorted(found, key=lambda d: -_last_use(source, offset, d.name)):
            n = self.count_tokens(shown(d) + "\n")
            if used + n <= limit:
                chosen.append(d)
                used += n
        blocks: dict[Path, list[str]] = {}
        for d in reversed(chosen):
            blocks.setdefault(d.path, []).append(shown(d))
        return "".join(self._block(p, "\n".join(texts)) for p, texts in blocks.items()) + after

    def _header(self, key: str) -> str:
        """The file's path as a line comment (`# pkg/utils.py`), put above its text while the
        prompt starts at the file's start: without it a short or new file gives a 135M model no
        sign of its language or purpose (smol wrote prose after `def`, C after `#`), and with
        the workspace context it is headed like the files before it. Gone at the first re-cut:
        the prompt then starts inside the file, and the re-cut prefills anew anyway."""
        path = to_path(key)
        comment = LINE_COMMENT.get(path.suffix[1:].lower()) if path is not None else None
        if comment is None:
            return ""
        return f"{comment} {self._shown_path(path)}\n"

    def _in_form(self, text: str) -> str:
        if self.context_form == "comment":
            # Every line a comment: notes above the file, not code the file already holds.
            return "\n".join(f"# {line}" for line in text.splitlines())
        return text

    def _block(self, path: Path, text: str) -> str:
        """`text` from the file `path`, headed by its path as if that file came first."""
        return f"# {self._shown_path(path)}\n{text}\n\n"

    def _windows(self, key: str, prefix: str, open_docs: dict[Path, str]) -> str:
        """The retrieved windows, the most similar last (nearest the file), within window_share."""
        if not self.context_windows:
            return ""
        found = similar_windows(self._workspace, prefix, to_path(key), open_docs, self.context_windows)
        return self._fit((self._block(w.path, self._in_form(w.text)) for w in found), self.window_share)

    def _edited(self, prefix: str, edits: Sequence[tuple[str, str]]) -> str:
        """The edited spans most like the lines above the cursor, the most similar last, within
        edit_share."""
        chosen = most_similar(prefix, list(edits), self.edit_chunks)
        return self._fit((self._block(to_path(name) or Path(name), self._in_form(text))
                          for name, text in chosen), self.edit_share)

    def _fit(self, blocks: Iterable[str], share: float) -> str:
        """Of `blocks` (the most wanted first), each that still fits in `share` of the budget,
        the most wanted last: nearest the file."""
        kept, used, limit = [], 0, int(self.budget * share)
        for block in blocks:
            n = self.count_tokens(block)
            if used + n <= limit:
                kept.append(block)
                used += n
        return "".join(reversed(kept))

    def _shown_path(self, path: Path) -> str:
        for root in self._workspace.roots:
            if path.is_relative_to(root):
                return path.relative_to(root).as_posix()
        return path.name

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


_NOT_USES = ("from ", "import ", "def ", "class ", "async def ", "#", "@", '"', "'")


def _usages(name: str, others: Sequence[tuple[str, str]], shown: str, limit: int = 2) -> list[str]:
    """Up to `limit` distinct lines of the other open documents that use `name`, stripped: how the
    workspace calls it. Not imports, definitions, comments, docstrings nor what `shown` holds."""
    use = re.compile(rf"(?<![\w.]){re.escape(name)}(?!\w)")
    out: list[str] = []
    for _, text in others:
        for m in use.finditer(text[:LOOKUP_CHARS]):
            start = text.rfind("\n", 0, m.start()) + 1
            end = text.find("\n", m.end())
            line = text[start:end if end != -1 else len(text)].strip()
            if (line and line not in out and line not in shown and len(line) <= 120
                    and not line.startswith(_NOT_USES)):
                out.append(line)
                if len(out) >= limit:
                    return out
    return out


_TOP_LEVEL = re.compile(r"^(?![\s#)\]}])", re.M)  # a line that starts a top-level statement


def _statement_start(source: str, offset: int) -> int:
    """The start of the top-level statement the cursor is in (its decorators and the comment lines
    right above it included); 0 when there is none."""
    start = 0
    for m in _TOP_LEVEL.finditer(source, 0, offset):
        if m.start() < len(source) and source[m.start()] != "\n":
            start = m.start()
    while start > 0:
        above = source.rfind("\n", 0, start - 1) + 1
        if not source.startswith(("@", "#"), above):
            break
        start = above
    return start


def _last_use(source: str, offset: int, name: str) -> int:
    """Where `name` was last written before the cursor, import statements left out; the cursor's
    own offset when never: a name imported and not used yet is about to be."""
    imports = [m.span() for m in IMPORT_STATEMENT.finditer(source, 0, offset)]
    for m in reversed(list(re.finditer(rf"(?<![\w.]){re.escape(name)}(?!\w)", source[:offset]))):
        if not any(a <= m.start() < b for a, b in imports):
            return m.start()
    return offset
