"""Post-processing of raw model text into what the editor shows. Pure functions over strings.

Promises:
- `decide_mode`: mid-line or after a complete statement → one line; after a block opener or on
  an empty line → a block.
- `block_end` finds where the suggestion must stop (end of line, or the first line that dedents
  below the block's indentation); the engine calls it while generating (stop_fn), so the model
  stops as soon as the block has ended instead of running to max tokens.
- `finalize` runs the gates below, drops what duplicates the suffix, balances brackets, strips
  trailing whitespace and returns None rather than an empty or whitespace-only suggestion.

Gates (compare Tabby's and Continue's completion filters):
- repetition: the same line or group of lines repeated (a list item's number aside) is kept
  once; a loop of characters or words (`but, but, but, but`) is cut where it starts on the first
  line, and a later line that holds one is dropped with all after it (`find_loop`);
- confidence: the suggestion is cut at the first line whose mean target log-probability per
  token is below log(`min_confidence`) (`cut_unconfident`; nothing when it is the first line);
- a suggestion that only re-types what follows the cursor is dropped (`retypes_suffix`);
- mid-line stays one line; at the end of a finished line the next line is offered only when
  confident (`Mode.next_line`), otherwise nothing;
- the first line never repeats indentation the editor already has;
- on an empty line, blank lines the suggestion starts with are dropped where they would leave
  more blank lines in a row than PEP 8 allows (`trim_blank_lead`);
- a block cut short (by the token limit, or shown early while still being written) loses its
  last line, which may stop mid-word (`for task in tasks_cor`); the first line always stays.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass

OPENERS = {"(": ")", "[": "]", "{": "}"}
CLOSERS = {v: k for k, v in OPENERS.items()}

# A line's confidence is the geometric mean of the target's probabilities of its tokens
# (exp of their mean log-probability); a line below `minConfidence` is not shown. Measured with
# `codespec-lsp bench quality --sweep` on benchmarks/corpus (100 points, token healing on): with
# the embedded pair confidence hardly tells right lines from wrong ones (mean similarity of the
# shown first lines 0.21 at every threshold up to 0.08), so stricter thresholds only hide
# suggestions. 0.02 (mean log-prob -3.9) is the strictest that hid none there; it still drops
# lines that are little more than a guess. A stronger model should be swept again.
DEFAULT_MIN_CONFIDENCE = 0.02
# Offering the next line after a finished one interrupts more than completing the current
# line does, so it needs this much more confidence (in log-probability: e^2 = 7.4 times the
# line threshold, 0.15 at the default). Measured at 80 ends of finished lines of
# benchmarks/corpus, the embedded pair's next lines were as far from the real ones at every
# bar from 0 to 0.3 (similarity ~0.18; offered at 72 % of line ends with only the line
# threshold, 61 % at 0.15, 54 % at 0.3): its confidence does not pick out good next lines,
# so the bar only sets how often it speaks up. A stronger model should be measured again.
NEXT_LINE_MARGIN = 2.0

# A loop inside a line: a unit of 2+ characters holding a letter, back to back until it makes
# MIN_LOOP_COPIES copies (the last may be partial): `but, but, but, but`, `run_run_run_run`,
# `str(str(str(str(`. Real code stops at three (`f(None, None, None)`), and its long runs of
# one unit are numbers, bytes and rulers (`0xffffffff`, `b"\x00\x00\x00\x00"`, `# ____`),
# which hold no letter once escapes and hex literals are set aside. find_loop flags 0.25 % of the
# 3-line windows of CPython's standard library (its tests' data tables, mostly; 0.8 % before).
_UNIT_RUN = re.compile(r"(.{2,40}?)\1{2,}")
MIN_LOOP_COPIES = 3.5
# A unit without a letter, space or comma loops at 8 copies: in 1.85 M lines of the standard
# library and the context packages 3 lines hold one (a regex, a test's digits, an ip6.arpa name).
_SYMBOL_UNIT = re.compile(r"[^\sA-Za-z,]+")
MIN_SYMBOL_UNIT_COPIES = 8
# A phrase of three words or more, words only, loops at 2.5 copies: smol's `a function_response
# that is a function_response that is a function_response` in a comment. Code repeats such a
# phrase twice (`x is None or y is None or`), and in 1.37 M lines of the standard library and the
# context packages never two and a half times; its longer repeats hold symbols
# (`str | None, str | None, str | None`) and are left to _UNIT_RUN.
_PHRASE_RUN = re.compile(r"(.{10,60}?)\1+")
_PHRASE = re.compile(r"[\w\s'.-]+")
MIN_PHRASE_COPIES = 2.5
MIN_PHRASE_WORDS = 3
_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|N\{[^}]*\}|.)")
_HEX_BEFORE = re.compile(r"0[xX][0-9a-fA-F_]*$")
_HEX_UNIT = re.compile(r"[0-9a-fA-F_]+")
_LETTER = re.compile(r"[A-Za-z]")
# A run of one symbol after code on its line (`self.value !!!!!!!!!!!!`): no language writes 8 in a
# row there. Rulers and banners are comments, strings or lines of their own (`# =====`,
# `"-" * 40`, a reST underline in a docstring), so a run goes only where the line before it holds
# code and no comment or string opener. Brackets are left to balance_brackets (Lisp closes 8).
_SYMBOL_RUN = re.compile(r"([^\w\s()\[\]{}'\"`#\\])\1{7,}")
_NOT_CODE_BEFORE = re.compile(r"#|//|/\*|--|['\"`]")
# A run of one symbol, comments and strings included, that goes past this column: the banners of
# human code end before it (none of the 3,400 runs of 8 or more in 1.4 M lines of Python and
# TypeScript does), smol's `// //////…` went on for 400 characters.
_ANY_RUN = re.compile(r"([^\w\s])\1{7,}")
WIDEST_RUN_END = 120
_IF_HEADER = re.compile(r"\s*(?:if|elif)\s+(.*?)\s*:")
# The number of a numbered list's item (`4. `, `# 2) `), at the start of a line of a docstring or
# comment: the same item under the next number is a counter going on, not a new item. Only that
# number is set aside, so data tables (`(1, 0, 0),`), which differ in digits elsewhere, stay code.
_LIST_NUMBER = re.compile(r"^(\s*(?:#\s*)?)\d+([.)]\s)")
# A line ending in one of these continues on the next line: it is not finished.
_CONTINUE_CHARS = tuple(",([{\\+-*/%=&|^<>.@:~")
_CONTINUE_WORDS = {"and", "or", "not", "in", "is", "lambda", "await", "import", "from"}


@dataclass(frozen=True)
class Mode:
    multiline: bool
    min_indent: int   # a later non-blank line indented less than this ends the block
    # One line, at the end of a finished line: the suggestion may be the next line (shown only
    # when confident) instead of more of this one.
    next_line: bool = False


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def decide_mode(line_prefix: str, line_suffix: str, prev_line: str = "") -> Mode:
    """`line_prefix`/`line_suffix`: the cursor line split at the cursor (no newline).

    `prev_line` is the nearest non-blank line above, used when the cursor is on an empty line
    right after a block opener.
    """
    before = line_prefix.rstrip()
    rest = line_suffix.strip()
    if rest and not all(c in ")]}:,;'\"" for c in rest):
        return Mode(False, 0)  # mid-line with real text to the right: complete the line only
    if not before:
        # Empty (or whitespace-only) line: a block at the cursor's indentation, or deeper
        # when the line above opens a block and the cursor is not yet indented.
        indent = len(line_prefix)
        if prev_line.rstrip().endswith(":") and indent <= _indent(prev_line):
            indent = _indent(prev_line) + 1
        return Mode(True, indent)
    if before.endswith(":") and not rest:
        return Mode(True, _indent(line_prefix) + 1)
    return Mode(False, 0, next_line=not rest and line_finished(line_prefix))


def line_finished(line: str) -> bool:
    """The line reads as a complete statement: brackets closed, no trailing operator or comma."""
    code = line.rstrip()
    if not code or _scan_depth(code) > 0:
        return False
    if code.lstrip().startswith("#"):
        return True
    last = code.split()[-1]
    return not (code.endswith(_CONTINUE_CHARS) or last in _CONTINUE_WORDS)


def _scan_depth(text: str, depth: int = 0) -> int:
    """Bracket depth after `text`, skipping string literals and comments on each line."""
    quote = None
    i = 0
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif text.startswith(quote, i):
                i += len(quote) - 1
                quote = None
            elif c == "\n" and len(quote) == 1:
                quote = None
        elif c == "#":
            nl = text.find("\n", i)
            i = len(text) if nl == -1 else nl
            continue
        elif c in "'\"":
            quote = text[i:i + 3] if text[i:i + 3] in ('"""', "'''") else c
            i += len(quote) - 1
        elif c in OPENERS:
            depth += 1
        elif c in CLOSERS:
            depth -= 1
        i += 1
    return depth


def block_end(text: str, mode: Mode) -> int | None:
    """Index in `text` where the suggestion ends, or None if it may still continue.

    Usable on partial text: a line is only judged once its first non-blank character exists.
    """
    if not mode.multiline:
        nl = text.find("\n")
        if nl == -1:
            return None
        if text[:nl].strip():
            return nl
        if not mode.next_line:
            return 0
        # The current line is finished: the suggestion is the next line, judged when it ends.
        nl2 = text.find("\n", nl + 1)
        if nl2 == -1:
            return None
        return nl2 if text[nl + 1:nl2].strip() else 0
    lines = text.split("\n")
    pos = len(lines[0]) + 1
    depth = _scan_depth(lines[0])
    blank_run = 0
    for line in lines[1:]:
        if line.strip():
            dedent = _indent(line) < mode.min_indent
            # At module level nothing dedents: a new statement after a blank line ends it.
            new_top = mode.min_indent == 0 and blank_run > 0 and _indent(line) == 0
            if depth <= 0 and (dedent or new_top):
                return pos - 1 - blank_run
            blank_run = 0
        elif pos + len(line) < len(text):
            blank_run += 1
            if blank_run >= 2 and depth <= 0:
                return pos - 1 - (blank_run - 1)
        depth = _scan_depth(line + "\n", depth)
        pos += len(line) + 1
    return None


def trim_suffix_overlap(text: str, line_prefix: str, suffix: str) -> str:
    """Drop what the document already has after the cursor.

    - closers the editor auto-inserted (`print(|)`): when the suggestion closes brackets opened
      before the cursor and the line already continues with the same closers, keep one copy;
    - whole lines equal to the next non-blank line after the cursor: the model is re-typing
      code that exists, so the suggestion stops there.
    """
    line_suffix = suffix.split("\n", 1)[0]
    lead = line_suffix.lstrip()
    lead_closers = len(lead) - len(lead.lstrip(")]}"))
    if lead_closers:
        # How many of the suggestion's trailing closers close brackets opened before the cursor.
        before = max(_scan_depth(line_prefix), 0)
        after = _scan_depth(line_prefix + text)
        closes_outer = min(max(before - after, 0), before)
        stripped = text.rstrip()
        # The suggestion must end with exactly the closers the line already starts with.
        for n in range(min(closes_outer, lead_closers), 0, -1):
            if stripped.endswith(lead[:n]):
                text = stripped[:-n]
                break
    next_lines = [ln.strip() for ln in suffix.split("\n")[1:] if ln.strip()]
    if next_lines and "\n" in text:
        lines = text.split("\n")
        for i, line in enumerate(lines[1:], start=1):
            if line.strip() and line.strip() == next_lines[0]:
                text = "\n".join(lines[:i])
                break
    return text


def balance_brackets(text: str) -> str:
    """Close what the suggestion itself opened but did not close (generation was cut short).

    One line: append the missing closers, unless it ends with an opener: what goes inside is on
    the lines the model wrote next (`from m import (`), and an empty pair (`import ()`) would be
    a guess, often not even code. Nor when it ends inside a string or after a comma or an
    operator: the closers would land in the string (`d["key_na]`) or after a dangling `,`
    (`setmode(fileno(file),)`), where the model was still writing. Several lines: cut back to
    the last line end at which the suggestion's own brackets were balanced, since guessing a
    multi-line closer's indentation would more often be wrong than right.
    """
    stack: list[str] = []
    last_balanced_nl = -1
    quote = None
    for i, c in enumerate(text):
        if quote:
            if c == quote or c == "\n":
                quote = None
            continue
        if c in "'\"":
            quote = c
        elif c in OPENERS:
            stack.append(OPENERS[c])
        elif c in CLOSERS and stack and stack[-1] == c:
            stack.pop()
        elif c == "\n" and not stack:
            last_balanced_nl = i
    if not stack:
        return text
    if "\n" not in text:
        line = text.rstrip()
        still_writing = quote or line.endswith(_CONTINUE_CHARS)
        return line if still_writing else line + "".join(reversed(stack))
    return text[:last_balanced_nl] if last_balanced_nl >= 0 else text.split("\n", 1)[0]


def strip_trailing_whitespace(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.split("\n")).rstrip()


_EMPTY_COMMENT_END = re.compile(r"(?:^|\n)[ \t]*(?:#|//)[ \t]*\Z")


def drop_empty_comment_end(text: str) -> str:
    """`text` without a last line that is a comment marker and nothing else: it says nothing,
    and a suggestion of it alone is a `#` in an empty file (smol under the file's path comment,
    context._header) or the start of a comment the token limit cut. Trailing whitespace goes
    with it, as strip_trailing_whitespace leaves none."""
    m = _EMPTY_COMMENT_END.search(text)
    return text[:m.start()].rstrip() if m else text


def _line_loop_end(lines: list[str], starts: list[int], shown: list[str],
                   rows: list[int]) -> int | None:
    """End of the first copy when the same non-blank line, or group of up to 3, comes twice in a
    row (three times for a line without a letter or digit; blank lines between them aside), or
    a line again after one other line at its indentation (then both stay), an `if` whose body
    opens with the same test (the first stays), indentation included (`try:` inside `try:` is code),
    a list item's number aside (`4. A module …`, `5. A module …`: see _LIST_NUMBER).
    Lines are compared as shown (_as_shown)."""
    full = [_LIST_NUMBER.sub(r"\1#\2", line) for line in shown]
    ends = []  # each rule's first; the earliest of them wins
    for k in (1, 2, 3):
        for j in range(len(rows) - 2 * k + 1):
            group = rows[j:j + k]
            if all(full[a] == full[b] for a, b in zip(group, rows[j + k:j + 2 * k])) and \
                    _LETTER.search(_ESCAPE.sub("", "".join(lines[a] for a in group))):
                ends.append(starts[group[-1]] + len(lines[group[-1]]))
                break
    for a, b in zip(rows, rows[1:]):
        # An `if` whose body opens with the same test (smol on deepagents: `if spec is not
        # None:` twice, one inside the other; 0 in 57 k headers of the code above).
        if (m := _IF_HEADER.fullmatch(full[a])) and _indent(full[b]) > _indent(full[a]) and \
                full[b].strip() == f"if {m.group(1)}:":
            ends.append(starts[a] + len(lines[a]))
            break
    for a, b, c in zip(rows, rows[1:], rows[2:]):
        # A line of symbols alone (`^`, `)`) comes twice in code that closes or underlines, and
        # three times at one indentation in none: smol wrote 23 `^` lines in a docstring.
        if full[a] == full[b] == full[c] and not re.search(r"\w", full[a]):
            ends.append(starts[a] + len(lines[a]))
            break
        # A line again after one other at its indentation: smol's `x=x,` `y=y,` `x=x,` (one
        # triple in 1,300 of the standard library and the context packages, mostly test data).
        if full[a] == full[c] != full[b] and _indent(full[a]) == _indent(full[b]) and \
                _LETTER.search(full[a]):
            ends.append(starts[b] + len(lines[b]))
            break
    return min(ends, default=None)


def _as_shown(lines: list[str], line_prefix: str) -> list[str]:
    """The suggestion's lines as they will read, trailing blanks aside: the first after the cursor
    line's text, without indentation of its own when the cursor stands in the indentation
    (strip_doubled_indent)."""
    first = line_prefix + (lines[0].lstrip(" \t") if not line_prefix.strip() else lines[0])
    return [first] + [line.rstrip() for line in lines[1:]]


def _grown_line(lines: list[str], starts: list[int], shown: list[str],
                rows: list[int]) -> int | None:
    """End of the line before the first line that is the non-blank line above it with a unit
    written once more right after itself, at one place or more (`import LocalAgentType` then
    `import LocalAgentTypeType`; `defsRef = defsRef;` then `defsRefRef = defsRefRef;`): smol's
    loop across lines, which no line- or unit-repeat rule sees. A unit holds two letters or more,
    so `(n, n)` growing to `(n, n, n)` is code."""
    for above, row in zip(rows, rows[1:]):
        if _grown(shown[above], shown[row]):
            return starts[above] + len(lines[above])
    return None


def _grown(a: str, b: str) -> bool:
    """`b` is `a` with one unit (2-40 characters, two letters or more) written again right after
    a copy of itself, at one place or more."""
    grown = len(b) - len(a)
    if not 2 <= grown <= 80:
        return False
    at = min(len(os.path.commonprefix([a, b])), len(a))
    for size in range(2, min(grown, 40) + 1):
        unit = b[at:at + size]
        if grown % size or a[max(at - size, 0):at] != unit or len(_LETTER.findall(unit)) < 2:
            continue
        # Walk both lines; where they part, `b` must hold the unit (as it reads there, a
        # rotation of it when the text after the copy begins like the unit) again.
        i = j = 0
        while j < len(b):
            if i < len(a) and a[i] == b[j]:
                i, j = i + 1, j + 1
            elif j >= size and b[j:j + size] == b[j - size:j] and b[j:j + size] in unit * 2:
                j += size
            else:
                break
        if i == len(a) and j == len(b):
            return True
    return False


# A line that gives an argument or a parameter (`name=value,`, `name: type = None,`; `name =` with
# spaces is an assignment, `lambda:` a lambda). The same name twice in one list is a SyntaxError,
# so the second copy is the model going round again (smol: `signature_type="v2",` then
# `signature_type="v4",` and on, in one call).
_KEYWORD_LINE = re.compile(r"\s*\**(?!lambda\b)(\w+)(?:=(?!=)|:\s).*,")


def _list_names(lines: Iterable[str], indent: int) -> Iterator[tuple[int, str]]:
    """(index, name) of each of `lines` at `indent` that gives an argument or parameter
    (_KEYWORD_LINE), up to a non-blank line indented less: the names one list gives, in the
    order `lines` come (deeper lines are a nested list's)."""
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        if _indent(line) < indent:
            return
        if _indent(line) == indent and (m := _KEYWORD_LINE.fullmatch(line)):
            yield i, m.group(1)


def _keyword_again(lines: list[str], starts: list[int], shown: list[str], rows: list[int],
                   line_prefix: str, given: Collection[str] = ()) -> int | None:
    """End of the line before the first that gives a name already given in its argument or
    parameter list (_list_names). `given`: the names the lines above the cursor gave in the list
    the first line goes on (keywords_above)."""
    for at, first in enumerate(rows):
        indent = _indent(shown[first])
        seen = set(given) if at == 0 and indent == len(line_prefix) else set()
        for i, name in _list_names(shown[first:], indent):
            if name in seen:
                above = [r for r in rows if r < first + i]
                return starts[above[-1]] + len(lines[above[-1]]) if above else 0
            seen.add(name)
    return None


def keywords_above(source: str, offset: int, max_lines: int = 64) -> frozenset[str]:
    """The names given as arguments or parameters (_KEYWORD_LINE) on the lines above the cursor's
    at its indentation, up to a line indented less: the list a suggestion on an empty line goes
    on (OpenAI's agents: `trace_workflow_name=...,` suggested under the same keyword). Empty when
    the cursor line holds code before the cursor."""
    start = source.rfind("\n", 0, offset) + 1
    prefix = source[start:offset]
    if prefix.strip():
        return frozenset()
    head = start  # where the max_lines lines above begin: no split of the whole file
    for _ in range(max_lines):
        if head <= 0:
            break
        head = source.rfind("\n", 0, head - 1) + 1
    above = source[head:start].split("\n")[:-1]  # the text up to the cursor's line ends in \n
    return frozenset(name for _, name in _list_names(reversed(above), len(prefix)))


def _symbol_run(lines: list[str], line_prefix: str) -> tuple[int, int] | None:
    """(line, column) where the first run of one symbol in code starts (see _SYMBOL_RUN), or
    where the comment or string starts that holds one going past WIDEST_RUN_END (_ANY_RUN)."""
    for row, line in enumerate(lines):
        head = line_prefix if row == 0 else ""
        cols = [m.start() for m in _SYMBOL_RUN.finditer(line)
                if re.search(r"\w", before := head + line[:m.start()])
                and not _NOT_CODE_BEFORE.search(before)]
        for m in _ANY_RUN.finditer(line):
            if len(head) + m.end() > WIDEST_RUN_END:
                # The comment or string that holds it goes too: a bare `#` or `//` says nothing.
                opener = _NOT_CODE_BEFORE.search(line, 0, m.start())
                cols.append(opener.start() if opener else
                            0 if _NOT_CODE_BEFORE.search(head) else m.start())
        if cols:
            return row, min(cols)
    return None


def _copies(line: str, m: re.Match) -> float:
    """Copies of the unit `m` matched back to back, a partial copy after them counted in part."""
    unit = m.group(1)
    after = line[m.end():m.end() + len(unit)]
    partial = next((i for i, (a, b) in enumerate(zip(after, unit)) if a != b), len(after))
    return (len(m.group(0)) + partial) / len(unit)


def _unit_loop(lines: list[str]) -> tuple[int, int] | None:
    """(line, column) where the first loop of a unit of characters starts (see _UNIT_RUN and
    _PHRASE_RUN); inside a word, after the unit's first copy, so the word the model was writing
    is not cut in two (smol's `# `on_delete_delete_delete` keeps `on_delete`, not `on`)."""
    for row, line in enumerate(lines):
        starts = []
        for m in _UNIT_RUN.finditer(line):
            unit = m.group(1)
            if _HEX_BEFORE.search(line[:m.start()]) and _HEX_UNIT.fullmatch(unit):
                continue  # a hex literal: 0xffffffff
            copies = _copies(line, m)
            if not _LETTER.search(_ESCAPE.sub("", unit)):
                # digits, punctuation, escapes: 0.3333, ----, \x00\x00, [0, 0, 0, 0] are data;
                # `.0` eight times is not (smol: `1.0.0.1.0.0.0.0.0.0.0.0.0`)
                if copies < MIN_SYMBOL_UNIT_COPIES or not _SYMBOL_UNIT.fullmatch(unit) or \
                        len(set(unit)) < 2:
                    continue
            elif copies < MIN_LOOP_COPIES:
                continue
            mid_word = m.start() > 0 and re.fullmatch(r"\w\w", line[m.start() - 1] + unit[0])
            starts.append(m.start() + len(unit) if mid_word else m.start())
            break
        for m in _PHRASE_RUN.finditer(line):
            unit = m.group(1)
            if _PHRASE.fullmatch(unit) and len(unit.split()) >= MIN_PHRASE_WORDS and \
                    _copies(line, m) >= MIN_PHRASE_COPIES:
                starts.append(m.start())
                break
        if starts:
            return row, min(starts)
    return None


def find_loop(text: str, line_prefix: str = "", given: Collection[str] = ()) -> int | None:
    """Where the suggestion must end because of a loop (keep `text[:i]`), or None.

    `line_prefix`: the cursor line before the cursor (the suggestion's first line follows it).
    - the same line, or group of up to 3 lines, twice in a row: kept once (the first copy is
      often right: it is the model going on that goes wrong);
    - a loop of characters on the first line (`x = str(str(str(str(`): cut where the loop
      starts (inside a word, after its first copy), what comes before it is the model's best
      guess at the line the user is typing (on 100 held-out generations this showed 0.99 of
      points where Tabby's rule of dropping the line showed 0.81, with more similarity; keeping
      the loop's first copy, the earlier rule, scored the same within noise); a phrase of words
      two and a half times (_PHRASE_RUN) is cut the same way;
    - such a loop on a later line: that whole line goes (a half line would end the block);
    - a line that is the one above it with a unit written once more (_grown_line): kept once;
    - a keyword argument or parameter given again in its list (_keyword_again): kept once;
    - a run of one symbol after code on its line (_SYMBOL_RUN), cut or dropped the same way.
    """
    lines = text.split("\n")
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line) + 1)
    cuts = []
    run = _symbol_run(lines, line_prefix)
    if run is not None:
        row, col = run
        cuts.append(col if row == 0 else starts[row] - 1)
    # The line rules read the lines as shown (_as_shown) and skip blank ones (`rows`).
    shown = _as_shown(lines, line_prefix)
    rows = [i for i, line in enumerate(lines) if line.strip()]
    for end in (_line_loop_end(lines, starts, shown, rows), _grown_line(lines, starts, shown, rows),
                _keyword_again(lines, starts, shown, rows, line_prefix, given)):
        if end is not None:
            cuts.append(end)
    loop = _unit_loop(lines)
    if loop is not None:
        row, col = loop
        cuts.append(col if row == 0 else starts[row] - 1)
    return min(cuts) if cuts else None


def cut_repetition(text: str, line_prefix: str = "", given: Collection[str] = ()) -> str:
    """`text` up to where a loop makes it end (see find_loop)."""
    at = find_loop(text, line_prefix, given)
    return text if at is None else text[:at]


def line_confidences(text: str, logprobs: Sequence[tuple[int, float]]) -> list[float | None]:
    """Mean log-probability of the tokens of each line of `text` (None: no token ends there).

    `logprobs`: (end offset of the token's text in the raw model text, the target's log-prob of
    the token), in order. A token counts for the line holding its last character inside `text`,
    so a newline-plus-indent token counts for the line it starts: choosing to go on is part of
    that line's confidence."""
    sums = [0.0] * (text.count("\n") + 1)
    counts = [0] * len(sums)
    start = 0
    for end, logprob in logprobs:
        if start >= len(text):
            break
        last = min(end, len(text)) - 1
        if last >= start:
            line = text.count("\n", 0, last)
            sums[line] += logprob
            counts[line] += 1
        start = end
    return [s / c if c else None for s, c in zip(sums, counts)]


def cut_unconfident(text: str, logprobs: Sequence[tuple[int, float]], min_confidence: float) -> str:
    """`text` up to the first line whose mean log-probability is below `min_confidence`."""
    lines = text.split("\n")
    for i, confidence in enumerate(line_confidences(text, logprobs)):
        if confidence is not None and confidence < min_confidence:
            return "\n".join(lines[:i])
    return text


def mean_confidence(text: str, logprobs: Sequence[tuple[int, float]]) -> float | None:
    values = [c for c in line_confidences(text, logprobs) if c is not None]
    return sum(values) / len(values) if values else None


def retypes_suffix(text: str, suffix: str) -> bool:
    """The suggestion only re-types what the document already holds after the cursor."""
    compact = " ".join(text.split())
    return bool(compact) and " ".join(suffix.split()).startswith(compact)


def strip_doubled_indent(text: str, line_prefix: str, mode: Mode) -> str:
    """The editor has already indented the cursor line: the first line must not indent again.

    Exception: the cursor sits on an empty line no deeper than the block it must open; then the
    model's extra indentation is the one the block needs."""
    if not line_prefix or line_prefix[-1] not in " \t":
        return text
    if mode.multiline and not line_prefix.strip() and len(line_prefix) < mode.min_indent:
        return text
    first, nl, rest = text.partition("\n")
    return first.lstrip(" \t") + nl + rest


# PEP 8 (and black): at most two blank lines in a row before top-level code, one inside a block.
MAX_BLANK_LINES_TOP = 2
MAX_BLANK_LINES_INDENTED = 1


def trim_blank_lead(text: str, line_prefix: str, blank_above: int,
                    blank_limit: int | None = None, top_of_file: bool = False) -> str:
    """On an empty line the model often starts with blank lines (`\\n\\nclass A:`) above lines
    where `blank_above` blank lines already stand: as shown, the code lands one line down or
    more, under a run of blank lines no formatter keeps. Drop the blank lines past the limit for
    the code's indentation; with none left, the code starts at the cursor, whose line already
    holds its indentation (`line_prefix`). `text` is unchanged when its code is not indented
    under the cursor's (a dedent): it cannot start at the cursor. A document that never leaves
    more than `blank_limit` blank lines in a row (one at least) sets a lower limit.
    `top_of_file`: nothing but blank lines above the cursor, where a blank line separates
    nothing (the model writes one under the file's path comment, context._header). Only leading
    text goes: the result is a suffix of `text`."""
    if line_prefix.strip():
        return text
    lines = text.split("\n")
    first_code = next((i for i, line in enumerate(lines) if line.strip()), None)
    if not first_code:
        return text  # code on the cursor's line already, or nothing but blank lines
    code = lines[first_code]
    indented = bool(code[:_indent(code)])
    allowed = MAX_BLANK_LINES_INDENTED if indented else MAX_BLANK_LINES_TOP
    if blank_limit is not None:
        allowed = min(allowed, max(blank_limit, 1))
    if top_of_file:
        allowed = 0
    if blank_above + first_code <= allowed:
        return text
    keep = max(allowed - blank_above, 0)
    rest = "\n".join(lines[first_code:])
    if keep:
        return "\n" * keep + rest
    if not code.startswith(line_prefix):
        return text
    return rest[len(line_prefix):]


def drop_unfinished_line(text: str) -> str:
    """`text` without its last line when a line with code comes before it: cut by the token
    limit, the last line may end mid-word or mid-expression, and accepted it would leave broken
    code to mend. (GitLab's AI gateway trims a truncated code suggestion back too.) Then without
    the lines at its end that open what the cut left out (_opens_more): a decorator, a header
    ending in `:`, a docstring's opening quotes; the first line always stays."""
    last = text.rfind("\n")
    text = text[:last] if last > 0 and text[:last].strip() else text
    while (last := text.rfind("\n")) > 0 and _opens_more(text[last + 1:], text[:last]) and \
            text[:last].strip():
        text = text[:last].rstrip()
    return text


# A line of code that ends with a binary operator or a backslash: its right operand is on the
# next line. `.` and words (`and`, `in`) end prose lines too, `*` ends `import *`: not counted.
_DANGLING_OPERATOR = re.compile(r"[\w)\]}'\"]\s*(\+|-|\*\*|//?|%|[=!<>]=|=|<|>|&|\||\^|@|\\)\Z")


def _opens_more(line: str, before: str) -> bool:
    """Whether `line`, after `before`, only opens what comes after it: smol's truncated blocks
    ended on `@abstractmethod`, on `if x:`, on a docstring's opening quotes under its header and
    on `X = Y +` (its operand was on the line the cut dropped). Quotes after anything else stay:
    after prose they may be the closing ones of the prompt's."""
    code = line.strip()
    return code.startswith("@") or code.endswith(":") or \
        (code in ('"""', "'''") and before.rstrip().endswith(":")) or \
        (not code.startswith("#") and _DANGLING_OPERATOR.search(code) is not None)


def blank_lines_above(source: str, offset: int) -> int:
    """How many blank lines stand right above the cursor's line."""
    count, end = 0, source.rfind("\n", 0, offset)
    while end >= 0:
        start = source.rfind("\n", 0, end) + 1
        if source[start:end].strip():
            break
        count, end = count + 1, start - 1
    return count


_BLANK_RUN = re.compile(r"\n(?:[^\S\n]*\n)+")  # blank as str.strip() reads it: `\r` too (CRLF)


def longest_blank_run(source: str, offset: int) -> int:
    """The most blank lines in a row the document holds, the run around the cursor's line aside:
    the file's own limit, where it is below PEP 8's. TypeScript and C files, and 4 % of Python
    modules with two top-level definitions or more, never leave two; smol went on adding a second
    (`\n// ZodCatch` under one blank line, at 7 of 76 line starts in zod's TypeScript)."""
    start = source.rfind("\n", 0, offset) + 1
    end = source.find("\n", offset)
    spans = [(0, start)] + ([(end, len(source))] if end >= 0 else [])
    return max((m.group(0).count("\n") - 1 for span in spans
                for m in _BLANK_RUN.finditer(source, *span)), default=0)


def finalize(raw: str, line_prefix: str, suffix: str, mode: Mode,
             logprobs: Sequence[tuple[int, float]] | None = None,
             min_confidence: float | None = None, blank_above: int = 0,
             truncated: bool = False, keywords_given: Collection[str] = (),
             blank_limit: int | None = None, top_of_file: bool = False) -> str | None:
    """The whole pipeline: block end, leading blank lines, loops, confidence, suffix overlap,
    brackets, whitespace, an empty comment at the end; None when nothing is worth showing.

    `logprobs`: (end offset in `raw`, target log-prob) per generated token (see
    line_confidences); without them (a backend that reports none) the confidence gate is off and
    the next line after a finished one is never offered. `min_confidence` defaults to
    DEFAULT_MIN_CONFIDENCE; it is a probability (0 turns the gate off). `blank_above`: the blank
    lines right above the cursor's line (blank_lines_above). `truncated`: the text stops where the
    model was cut off or is still writing (its token limit, an answer shown early), not where
    the model or the block ended. `keywords_given`: the names the list the suggestion goes on
    already gives (keywords_above). `blank_limit`: the most blank lines in a row the document
    holds elsewhere (longest_blank_run); None: PEP 8's limits alone. `top_of_file`: nothing
    but blank lines above the cursor (trim_blank_lead)."""
    prob = DEFAULT_MIN_CONFIDENCE if min_confidence is None else min_confidence
    threshold = math.log(prob) if prob > 0 else -math.inf
    end = block_end(raw, mode)
    text = raw if end is None else raw[:end]
    if mode.multiline:
        if truncated and end is None:
            text = drop_unfinished_line(text)
        trimmed = trim_blank_lead(text, line_prefix, blank_above, blank_limit, top_of_file)
        # Only leading text went: every token's end offset moves back by its length.
        logprobs = [(at - len(text) + len(trimmed), lp) for at, lp in logprobs or ()]
        text = trimmed
    else:
        first, nl, rest = text.partition("\n")
        if first.strip() or not mode.next_line:
            text = first  # mid-line, or more of the current line: one line
        else:
            text = nl + rest.split("\n", 1)[0]
            confidence = mean_confidence(text, logprobs) if logprobs else None
            if confidence is None or confidence < threshold + NEXT_LINE_MARGIN:
                return None  # the next line, and not confident enough to interrupt with it
    text = cut_repetition(text, line_prefix, keywords_given)
    if logprobs:
        text = cut_unconfident(text, logprobs, threshold)
    text = trim_suffix_overlap(text, line_prefix, suffix)
    text = balance_brackets(text)
    text = strip_doubled_indent(text, line_prefix, mode)
    text = drop_empty_comment_end(strip_trailing_whitespace(text))
    if not text.strip() or retypes_suffix(text, suffix):
        return None
    return text
