"""Post-processing of raw model text into what the editor shows. Pure functions over strings.

Promises:
- `decide_mode`: mid-line or after a complete statement → one line; after a block opener or on
  an empty line → a block.
- `block_end` finds where the suggestion must stop (end of line, or the first line that dedents
  below the block's indentation); the engine calls it while generating (stop_fn), so the model
  stops as soon as the block has ended instead of running to max tokens.
- `finalize` drops what duplicates the suffix, balances brackets, strips trailing whitespace and
  returns None rather than an empty or whitespace-only suggestion.
"""

from __future__ import annotations

from dataclasses import dataclass

OPENERS = {"(": ")", "[": "]", "{": "}"}
CLOSERS = {v: k for k, v in OPENERS.items()}


@dataclass(frozen=True)
class Mode:
    multiline: bool
    min_indent: int   # a later non-blank line indented less than this ends the block


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
    return Mode(False, 0)


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
        return nl if text[:nl].strip() else 0
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

    One line: append the missing closers. Several lines: cut back to the last line end at which
    the suggestion's own brackets were balanced, since guessing a multi-line closer's indentation
    would more often be wrong than right.
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
        return text.rstrip() + "".join(reversed(stack))
    return text[:last_balanced_nl] if last_balanced_nl >= 0 else text.split("\n", 1)[0]


def strip_trailing_whitespace(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.split("\n")).rstrip()


def finalize(raw: str, line_prefix: str, suffix: str, mode: Mode) -> str | None:
    """The whole pipeline: block end, suffix overlap, brackets, whitespace; None when empty."""
    end = block_end(raw, mode)
    text = raw if end is None else raw[:end]
    text = trim_suffix_overlap(text, line_prefix, suffix)
    text = balance_brackets(text)
    text = strip_trailing_whitespace(text)
    if not text.strip():
        return None
    return text
