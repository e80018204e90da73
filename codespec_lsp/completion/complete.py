"""One completion from document text and a cursor: context → engine → post-processing.

The server's worker and `codespec-lsp complete` both go through `complete_at`, so what the CLI
prints is what an editor would be shown.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cachetools import LRUCache

from codespec_lsp.completion.context import ContextBuilder
from codespec_lsp.engine.api import CancelToken, GenerationResult
from codespec_lsp.engine.scoring import PURE, Scoring
from codespec_lsp.completion.heal import ends_in_indent, healing, typed_word, vocab_of
from codespec_lsp.completion.postprocess import (block_end, blank_lines_above, decide_mode, finalize,
                                                 keywords_above, longest_blank_run)


def split_line(source: str, offset: int) -> tuple[str, str, str]:
    """(text before the cursor on its line, text after it, nearest non-blank line above)."""
    start = source.rfind("\n", 0, offset) + 1
    end = source.find("\n", offset)
    prev, i = "", start - 1
    while i > 0 and not prev.strip():
        j = source.rfind("\n", 0, i) + 1
        prev, i = source[j:i], j - 1
    return source[start:offset], source[offset:end if end != -1 else len(source)], prev


class Detokenizer:
    """Text of new ids, decoded with a few prompt ids in front: decoders such as CodeLlama's strip
    the leading space of the first token, so new ids are never decoded on their own."""

    CONTEXT = 4

    def __init__(self, tokenizer, prompt_ids: Sequence[int]) -> None:
        special = set(getattr(tokenizer, "all_special_ids", []) or [])
        self.tokenizer = tokenizer
        self.context = [t for t in prompt_ids if t not in special][-self.CONTEXT:]
        self.head = self._decode(self.context)
        self.ids: list[int] = []

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def add(self, token: int) -> str:
        """All new text so far (a multi-byte character split across tokens waits for its end)."""
        self.ids.append(token)
        return self.text

    @property
    def text(self) -> str:
        full = self._decode(self.context + self.ids)
        new = full[len(self.head):] if full.startswith(self.head) else self._decode(self.ids)
        return new.rstrip("\ufffd")


def token_logprobs(tokenizer, prompt: Sequence[int], result: GenerationResult, heal: str = ""
                   ) -> list[tuple[int, float]]:
    """(end offset of each new token's text in result.text, its target log-prob), what
    postprocess.finalize's confidence gate reads; empty when the backend reported no log-probs.
    With `heal`, offsets count from the cursor (the re-typed `heal` is not in result.text)."""
    if tokenizer is None or len(result.logprobs) != len(result.tokens):
        return []
    detok = Detokenizer(tokenizer, prompt)
    return [(max(len(detok.add(t)) - len(heal), 0), lp) for t, lp in zip(result.tokens, result.logprobs)]


HEAL_MAX_TOKENS = 8  # a long half-typed name (`post_order_f` is 6 tokens here) is backed up whole
_WORD_PIECE = re.compile(r"[ \t]?\w+")
_WORD_CHARS = re.compile(r"\w*")
_WORD_CHAR = re.compile(r"\w")
_LEADING_SPACE = re.compile(r"\s*")
WORDS_WINDOW = 50_000


def prompt_ids(backend, prompt: str) -> tuple[list[int], str]:
    """(the prompt's ids with BOS, the text `heal` removed for token healing: "" when none).

    Token healing: a prompt ending mid-line ends in a token the tokenizer chose without seeing
    what follows (`os.pa` before `th`, indentation before `if`: byte-level BPE merges "\n    " into
    one token and the model then starts its answer with " if", leaving 5 spaces). The last token is
    backed up and its text returned as `heal`; the backend constrains its first token(s) to
    re-type it. Only for backends that say `supports_heal` (a remote server cannot constrain).

    A half-typed word is backed up whole, not only its last token: `ret` reads " re" + "t", and
    left with " re" in the prompt the model must go on from a split it never saw in training
    (" return" is one token), so it answered `ret = ...`; backed up to " ret", " return" is open.
    Word pieces (an optional space, then letters, digits, `_`) are backed up while the text
    already backed up starts inside the word, up to HEAL_MAX_TOKENS. So is any token that one
    vocabulary token would read together with the text backed up (`value !` reads " " + "!", and
    " !=" is one token: left after a lone " ", the model wrote `!!!!`), but not over a newline."""
    ids = backend.encode(prompt)
    tokenizer = getattr(backend, "tokenizer", None)
    if (not getattr(backend, "supports_heal", False) or tokenizer is None or len(ids) < 2
            or not prompt or prompt.endswith("\n")):
        return ids, ""
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    if ids[-1] in special:
        return ids, ""  # e.g. a FIM prompt ending in <MID>
    cut = len(ids) - 1
    heal = _backed_up(tokenizer, ids, cut)
    vocab = vocab_of(backend)
    while heal and cut > 1 and len(ids) - cut < HEAL_MAX_TOKENS and ids[cut - 1] not in special:
        piece = _backed_up(tokenizer, ids[:cut], cut - 1)
        if not piece or not ((_WORD_CHAR.match(heal) and _WORD_PIECE.fullmatch(piece))
                             or ("\n" not in piece and vocab.spanned(piece + heal))):
            break  # "": a byte piece of a character, which no allowed token can re-type
        cut, heal = cut - 1, piece + heal
    # Decoded as a whole (what the prompt really loses), and only as much as the vocabulary can
    # re-type: a character it spells in byte pieces alone (`é`, `日`, `😀` in a small vocabulary)
    # is left in the prompt, or the constrained generation would have no token to take.
    heal = _backed_up(tokenizer, ids, cut)
    while heal and prompt.endswith(heal) and not vocab.retypeable(heal, ends_in_indent(heal)):
        cut += 1
        heal = _backed_up(tokenizer, ids, cut) if cut < len(ids) else ""
    if not heal or not prompt.endswith(heal):
        return ids, ""  # the tokens' text does not read back exactly: backing up would change the prompt
    return ids[:cut], heal


def document_words(source: str, offset: int, heal: str) -> set[str]:
    """The names near the cursor that the half-typed word `heal` ends in could become: those in
    `source` starting with it, the cursor's own word left out (completion.heal.Heal leans to them).
    Only WORDS_WINDOW characters each side are read (~3 ms): a huge file costs no more."""
    word = typed_word(heal)
    start = offset - len(word)
    if not word or source[start:offset] != word or _WORD_CHAR.match(source[start - 1:start]):
        return set()  # no word, or more of it typed than was backed up: no lean
    end = _WORD_CHARS.match(source, offset).end()
    names = re.compile(r"(?<!\w)" + re.escape(word) + r"\w*")
    return set(names.findall(source, max(start - WORDS_WINDOW, 0), start)) | \
        set(names.findall(source, end, end + WORDS_WINDOW))


def _backed_up(tokenizer, ids: list[int], cut: int) -> str:
    """The text of ids[cut:] as it reads after ids[:cut]."""
    detok = Detokenizer(tokenizer, ids[:cut])
    for token in ids[cut:]:
        detok.add(token)
    return detok.text


def _after_heal(heal: str, stop_fn: Callable[[str], int | None]) -> Callable[[str], int | None]:
    """`stop_fn` over the text after the re-typed `heal`, in the offsets of the whole text."""
    def cut(text: str) -> int | None:
        if len(text) < len(heal):
            return None
        at = stop_fn(text[len(heal):])
        return None if at is None else at + len(heal)
    return cut


def run(gen, tokenizer=None, prompt: Sequence[int] = (), stop: Sequence[str] = (),
        stop_fn: Callable[[str], int | None] | None = None,
        on_text: Callable[[str], None] | None = None) -> GenerationResult:
    """Drain a Generation (benches, calibration). With a tokenizer, the text is decoded and cut at
    the first stop string or where `stop_fn` says, closing the generation there. `on_text`: the
    text so far, after each token that did not end it."""
    detok = Detokenizer(tokenizer, prompt) if tokenizer is not None else None
    try:
        for tok in gen:
            if detok is None:
                continue
            text = detok.add(tok)
            cuts = [i for i in (text.find(s) for s in stop if s) if i >= 0]
            cut = stop_fn(text) if stop_fn is not None else None
            if cut is not None:
                cuts.append(cut)
            if cuts:
                gen.result.text = text[:min(cuts)]
                gen.close()
                gen.result.stop_reason = "stop"
                return gen.result
            if on_text is not None:
                on_text(text)
    finally:
        gen.close()
    if detok is not None:
        gen.result.text = detok.text
    return gen.result


def scoring_of(backend, exact: bool = False, **settings: float | None) -> Scoring:
    """The scoring a request runs under: the backend's measured knobs (`backend.scoring`,
    engine/scoring.py; none: the pure target), each overridden by a setting that is not None;
    `exact` turns the copy prior and the name lean off whatever either says."""
    measured: Scoring = PURE if exact else getattr(backend, "scoring", PURE)
    chosen = {k: v for k, v in settings.items() if v is not None}
    if exact:
        chosen.update(copy_weight=0.0, word_bias=0.0)
    return dataclasses.replace(measured, **chosen)


# The lookup text (the text after the cursor, then up to 200,000 characters of the other open
# documents) is the same at every keystroke in a line: tokenizing it again cost 20-30 ms each.
_LOOKUP_IDS: "weakref.WeakKeyDictionary[Any, LRUCache]" = weakref.WeakKeyDictionary()


def lookup_ids(backend: Any, text: str) -> list[int]:
    """backend.encode(text), kept per backend for the few lookup texts in use."""
    kept = _LOOKUP_IDS.get(backend)
    if kept is None:
        kept = _LOOKUP_IDS[backend] = LRUCache(maxsize=4)
    if text not in kept:
        kept[text] = backend.encode(text)
    return list(kept[text])


def complete_at(backend, builder: ContextBuilder, key: str, source: str, offset: int, *,
                max_tokens: int, cancel: CancelToken | None = None, speculative: bool = True,
                others: Sequence[tuple[str, str]] = (), roots: Sequence[str] = (),
                edits: Sequence[tuple[str, str]] = (),
                min_confidence: float | None = None,
                copy_weight: float | None = None, word_bias: float | None = None,
                exact: bool = False, deadline: float | None = None,
                early: Callable[[str], None] | None = None,
                **generate_options) -> tuple[GenerationResult, str | None]:
    """(the backend's result with its counts, the text to show or None when there is nothing).
    `deadline` (time.perf_counter) and `early`: past the deadline, the first time the text so
    far has something to show, `early` gets it (whole words, post-processed as the final answer
    would be, a block without its unfinished last line); the generation goes on to its end,
    which is what this returns.
    `others`, `roots`, `edits`: the open documents, workspace folders and spans just edited in
    other documents (ContextBuilder.build).
    `copy_weight`, `word_bias`, `min_confidence`: None takes the model's measured value
    (`backend.scoring`, engine/scoring.py; a backend without one runs the pure target).
    `exact`: the target's own output, no copy prior and no name lean, whatever the model or the
    settings say."""
    scoring = scoring_of(backend, exact, copy_weight=copy_weight, word_bias=word_bias,
                         min_confidence=min_confidence)
    copy_weight, word_bias = scoring.copy_weight, scoring.word_bias
    prompt = builder.build(key, source, offset, others, roots, edits)
    line_prefix, line_suffix, prev_line = split_line(source, offset)
    mode = decide_mode(line_prefix, line_suffix, prev_line)
    blank_above = blank_lines_above(source, offset)
    # Only an empty line's suggestion may start with blank lines (trim_blank_lead).
    blank_limit = longest_blank_run(source, offset) if not line_prefix.strip() else None
    given = keywords_above(source, offset)
    top_of_file = _LEADING_SPACE.match(source, 0, offset).end() == offset
    ids, heal = prompt_ids(backend, prompt.text)
    lookup = lookup_ids(backend, prompt.lookup_text) if prompt.lookup_text else []
    gen = backend.generate(ids, max_new_tokens=max_tokens, cancel=cancel, speculative=speculative,
                           key=key, lookup_ids=lookup,
                           constraint=healing(backend, heal, document_words(source, offset, heal)
                                              if word_bias > 0 else (), word_bias),
                           copy_weight=copy_weight,
                           **generate_options)
    def shown(text: str, result: GenerationResult, truncated: bool = False) -> str | None:
        return finalize(_from_cursor(text, heal), line_prefix, prompt.suffix, mode,
                        logprobs=token_logprobs(backend.tokenizer, ids, result, heal),
                        min_confidence=scoring.min_confidence, blank_above=blank_above,
                        truncated=truncated, keywords_given=given, blank_limit=blank_limit,
                        top_of_file=top_of_file)

    on_text = None
    if deadline is not None and early is not None:
        # Mid-generation the last line is as unfinished as one the token limit cut: a block shows
        # its finished lines, a single line its whole words.
        on_text = _early_answer(deadline, early,
                                lambda text: shown(whole_words(text), gen.result, truncated=True))
    result = run(gen, backend.tokenizer, ids, stop_fn=_after_heal(heal, lambda text: block_end(text, mode)),
                 on_text=on_text)
    if result.cancelled:
        return result, None
    text = shown(result.text, result, truncated=result.stop_reason == "max_tokens")
    result.text = _from_cursor(result.text, heal)
    return result, text


def _from_cursor(text: str, heal: str) -> str:
    """The model's text as seen from the cursor: what healing backed up over is already typed."""
    if not heal:
        return text
    return text[len(heal):] if text.startswith(heal) else ""


def whole_words(text: str) -> str:
    """`text` without a word the next token may still extend (`self.conf` -> `self.`). A keyword
    that code almost never extends stays (`        if`): showing it does not wait one more
    forward for the token after it."""
    tail = _WORD_TAIL.search(text).group()
    head = text[:len(text) - len(tail)]
    if head.endswith("."):  # `obj.return` can only go on: `obj.returns`
        return head
    if tail in WHOLE_KEYWORDS or (tail in WHOLE_AT_LINE_START and _LINE_START.search(head)):
        return text
    return head


_WORD_TAIL = re.compile(r"\w*$")
_LINE_START = re.compile(r"(^|\n)[ \t]*$")
# Measured on the .py files of benchmarks/corpus, heldout and unseen_tune in SmolLM2's tokenization
# (BPE: a model writes the canonical tokens): after a token that is one of these words, the next
# token continued the word (`return` -> `returns`) at most 3 % of the time (`if` 4 of 943, `return`
# 8 of 624, `def` 2 of 469, `raise` 3 of 117); the second set only as a line's first word (`for`
# 4 of 177, `from` 0 of 114, `import` 2 of 62, `class` 1 of 40; elsewhere 3-19 %). `is`, `in`,
# `as`, `or`, `with`, `match`, `break` continue more often (`is` -> `isinstance`) and wait like
# any word.
WHOLE_KEYWORDS = frozenset({"if", "elif", "else", "return", "def", "and", "not", "None", "True", "False",
                            "raise", "try", "except", "while", "assert", "yield", "pass", "continue",
                            "del", "await", "finally", "lambda"})
WHOLE_AT_LINE_START = frozenset({"for", "from", "import", "class"})


def _early_answer(deadline: float, early: Callable[[str], None],
                  shown: Callable[[str], str | None]) -> Callable[[str], None]:
    """The per-token hook that hands `early` the first showable text after `deadline`, once."""
    sent = False

    def on_text(text: str) -> None:
        nonlocal sent
        if sent or time.perf_counter() < deadline:
            return
        if (answer := shown(text)):
            sent = True
            early(answer)
    return on_text


def prefill_at(backend, builder: ContextBuilder, key: str, source: str, offset: int,
               others: Sequence[tuple[str, str]] = (), cancel: CancelToken | None = None,
               roots: Sequence[str] = (), edits: Sequence[tuple[str, str]] = ()) -> GenerationResult:
    """Warm-up (a file opened, an idle pause): the prompt a completion here would send, prefilled."""
    prompt = builder.build(key, source, offset, others, roots, edits)
    ids, _ = prompt_ids(backend, prompt.text)
    return backend.prefill(ids, key=key, cancel=cancel)


def offset_of(source: str, line: int, col: int) -> int:
    """Code-point offset of a 0-based (line, col); ValueError naming the problem otherwise."""
    lines = source.split("\n")
    if not 0 <= line < len(lines):
        raise ValueError(f"line {line} is outside the file (it has {len(lines)} lines, 0-based)")
    if not 0 <= col <= len(lines[line]):
        raise ValueError(f"column {col} is past the end of line {line} ({len(lines[line])} characters)")
    return sum(len(text) + 1 for text in lines[:line]) + col


def _remote_backend(args):
    """`complete --remote URL`: the server completes; the tokenizer comes from --target or the
    preset when given (else from the server), so the ids are the in-process engine's."""
    from codespec_lsp.config import Settings
    from codespec_lsp.remote import backend_from_settings
    return backend_from_settings(Settings(
        preset=args.preset, target=args.target, remote=args.remote,
        remote_model=getattr(args, "remote_model", None),
        api_key_env=getattr(args, "api_key_env", None)), notify=None)


def run_complete(args) -> int:
    from codespec_lsp.config import default_context_tokens
    from codespec_lsp.engine import ModelLoadError, load_engine

    path = Path(args.file)
    try:
        source = path.read_text(encoding="utf-8")
        offset = offset_of(source, args.line, args.col)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        print(f"codespec-lsp complete: {exc}", file=sys.stderr)
        return 2
    try:
        if getattr(args, "remote", None):
            engine = _remote_backend(args)
        else:
            engine = load_engine(preset=args.preset, draft=args.draft, target=args.target,
                                 device=args.device, dtype=args.dtype,
                                 allow_download=args.allow_download,
                                 trust_remote_code=args.trust_remote_code, drafter=args.drafter,
                                 exact=getattr(args, "exact", False))
    except ModelLoadError as exc:
        print(f"codespec-lsp complete: {exc}", file=sys.stderr)
        return 1
    builder = ContextBuilder(engine.count_tokens,
                             default_context_tokens(engine.context_window, args.max_tokens),
                             fim_tokens=engine.fim_tokens)
    result, text = complete_at(engine, builder, str(path), source, offset, max_tokens=args.max_tokens,
                               speculative=not args.no_speculative, temperature=args.temperature,
                               top_p=args.top_p, exact=getattr(args, "exact", False))
    if getattr(args, "remote", None):
        engine.close()
        for _, message in engine.health.unsent:  # the server's trouble, told once, on stderr
            print(message, file=sys.stderr)
        if result.stop_reason == "error":
            return 1
    if args.json:
        counts = result.to_dict()
        counts.pop("tokens")
        counts["raw_text"] = counts.pop("text")
        counts["backend"] = getattr(engine, "kind", "local")
        print(json.dumps({"text": text or "", **counts}, indent=2))
    else:
        print(text or "")
    return 0
