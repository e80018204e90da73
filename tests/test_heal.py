"""Token healing (SEAM.md `heal`): complete.prompt_ids backs up over the last token of a prompt
ending mid-line, and the engine constrains its first token(s) to re-type it, losslessly."""

from __future__ import annotations

import re

import pytest
import torch

from codespec_lsp.completion.complete import (HEAL_MAX_TOKENS, WORDS_WINDOW, complete_at, document_words,
                                  prompt_ids, run)
from codespec_lsp.completion.heal import WORD_BIAS, Heal, HealVocab, healing, vocab_of
from codespec_lsp.completion.context import ContextBuilder
from engine_helpers import DRAFT_KINDS, engine_of_kind, make_engine, tiny_parts

pytestmark = pytest.mark.slow

PROMPTS = ["def add(a, b):\n    ", "import os\n\npath = os.pa",
           "class Box:\n    def size(self):\n        ret"]
N_NEW = 16


@pytest.fixture(scope="module")
def parts():
    return tiny_parts()


def healed_reference(target, engine, ids: list[int], heal: str, n: int, words=(), bias: float = 0.0
                     ) -> list[int]:
    """The target's own greedy decoding under the constraint, by hand: while part of `heal` is
    still to come, only tokens whose text starts with the rest, or is a non-empty prefix of it;
    when `heal` ends in indentation, a token covering it does not go on with a space or tab; a
    token covering part of it and stopping inside a word or indentation is the longest such
    token. While the word `heal` ends inside is unfinished and some of `words` start with it, a
    token after which it can be none of them loses `bias` (a token ending right at the word keeps
    it only when the word is one of them: the word goes on otherwise, from a split the tokenizer
    never makes; a token going on into a name is the longest piece of it the vocabulary has, for
    the same reason)."""
    texts, rest, out = engine.token_texts, heal, []
    indent = heal.rsplit("\n", 1)[-1] != "" and not heal.rsplit("\n", 1)[-1].strip()
    typed = re.search(r"\w+$", heal)
    names = [w for w in words if typed and w.startswith(typed.group(0))]
    word = typed.group(0) if names and bias > 0 else None
    known = set(texts)

    def allowed(t: str) -> bool:
        if t.startswith(rest):
            return not (indent and t[len(rest):len(rest) + 1] in (" ", "\t"))
        if not t or not rest.startswith(t):
            return False
        longest = max(len(u) for u in texts if u and len(u) < len(rest) and rest.startswith(u))
        return len(t) == longest or not (rest[len(t)].isalnum() or rest[len(t)] in "_ \t")

    def grown(t: str) -> str | None:
        """The text `t` adds to the word (None: `t` only covers part of `rest`)."""
        if rest and not t.startswith(rest):
            return None
        return t[len(rest):]

    def longest_piece(name: str) -> str | None:
        ahead = name[len(word):]
        return next((rest + ahead[:n] for n in range(len(ahead), 0, -1) if rest + ahead[:n] in known), None)

    def keeps_word(t: str) -> bool:
        more = grown(t)
        if more is None:
            return True
        if not more:
            return bool(rest) and word in names
        stem = re.match(r"\w*", more).group(0)
        if stem == more:  # the word goes on: by the longest piece of a name there is
            return any(longest_piece(w) == t for w in names if w.startswith(word))
        return word + stem in names

    with torch.no_grad():
        for _ in range(n):
            logits = target(torch.tensor([ids + out])).logits[0, -1, :engine.vocab_size]
            if rest:
                ok = torch.tensor([allowed(t) for t in texts])
                logits = logits.masked_fill(~ok, float("-inf"))
            if word is not None:
                keep = torch.tensor([keeps_word(t) for t in texts])
                logits = logits - bias * (~keep).float()
            token = int(logits.argmax())
            if token in engine.stop_ids:
                break
            out.append(token)
            more = grown(texts[token])
            if rest:
                rest = "" if more is not None else rest[len(texts[token]):]
            if word is not None and more:
                word = word + more if re.fullmatch(r"\w*", more) else None
                if word is not None and not any(w.startswith(word) for w in names):
                    word = None
    return out


def test_prompt_ids_backs_up_over_the_last_token(parts):
    tok, target, _ = parts
    engine = make_engine(target, None, tok)
    ids, heal = prompt_ids(engine, "def add(a, b):\n    ")
    assert heal == "\n    "  # byte-level BPE merged the newline and the indentation
    assert ids == engine.encode("def add(a, b):\n    ")[:-1]
    assert prompt_ids(engine, "x = 1\n") == (engine.encode("x = 1\n"), "")  # at a line start: nothing

    class Remote:  # a backend that cannot constrain its output gets the prompt as it is
        tokenizer, supports_heal = tok, False
        encode = engine.encode
    assert prompt_ids(Remote(), "def add(a, b):\n    ") == (engine.encode("def add(a, b):\n    "), "")


def test_prompt_ids_backs_up_a_half_typed_word_whole(parts):
    """`ret` reads " re" + "t" here; backing up only "t" left the model after " re", a split it
    never saw (" return" is one token). The whole word goes, with its space, and no further."""
    tok, target, _ = parts
    engine = make_engine(target, None, tok)
    texts = engine.token_texts
    for prompt, word in [("class Box:\n    def size(self):\n        ret", " ret"),
                         ("        post_order_f", " post_order_f"), ("x = os.pa", "pa"),
                         ("if a.b and c", " c")]:
        full = engine.encode(prompt)
        ids, heal = prompt_ids(engine, prompt)
        assert heal == word and full[:len(ids)] == ids and "".join(texts[t] for t in full[len(ids):]) == word
    assert len(engine.encode("        ret")) - len(prompt_ids(engine, "        ret")[0]) == 2  # split here
    long = "x = " + "a" * 400  # a long word: at most HEAL_MAX_TOKENS tokens are backed up
    assert 0 < len(engine.encode(long)) - len(prompt_ids(engine, long)[0]) <= HEAL_MAX_TOKENS


def test_prompt_ids_backs_up_a_token_the_vocabulary_reads_with_the_next(parts):
    """`self.value !` reads " " + "!", and " !=" is one token: backing up only "!" left the model
    after a lone " ", a split it never saw, and it wrote `!!!!`."""
    tok, target, _ = parts
    engine = make_engine(target, None, tok)
    for prompt, healed in [("if self.value !", " !"), ("x = a !", " !")]:
        full = engine.encode(prompt)
        ids, heal = prompt_ids(engine, prompt)
        assert heal == healed and ids == full[:len(ids)] and len(full) - len(ids) == 2
        assert vocab_of(engine).spanned(heal)  # " !=" is open again
    ids, heal = prompt_ids(engine, "x = f(a)")  # ")" after "a": no token reads "a)", nothing more
    assert heal == ")" and ids == engine.encode("x = f(a)")[:-1]


def test_a_token_covering_part_of_a_word_is_the_longest_one():
    """Inside a word or a run of indentation only the longest partial cover is open (the
    tokenizer's own split is never " f" + "eatures"); where the rest goes on with a symbol, every
    partial cover is."""
    texts = ["", " f", " feature", " features", " featured", "s", " ", "\n", "\n  ", " if", "x.", "f"]
    vocab = HealVocab(texts)
    heal = Heal(vocab, " features")
    assert [texts[i] for i in heal.allowed(heal.rest).nonzero().flatten()] == [" feature", " features"]
    heal.accept([texts.index(" feature")])
    assert heal.rest == "s"
    line = Heal(vocab, "\n    ")  # the indentation too: "\n" + "    if" is no split either
    assert [texts[i] for i in line.allowed(line.rest).nonzero().flatten()] == ["\n  "]
    assert [texts[i] for i in Heal(vocab, "x.f").allowed("x.f").nonzero().flatten()] == ["x."]


@pytest.mark.parametrize("kind", DRAFT_KINDS)
def test_healed_speculative_equals_healed_target_greedy(parts, kind):
    tok, target, _ = parts
    engine = engine_of_kind(kind, parts)
    for prompt in PROMPTS:
        ids, heal = prompt_ids(engine, prompt)
        assert heal and prompt.endswith(heal)
        result = run(engine.generate(ids, max_new_tokens=N_NEW, constraint=healing(engine, heal),
                                     speculative=kind != "target"), tok, ids)
        assert result.tokens == healed_reference(target, engine, ids, heal, N_NEW), (kind, prompt)
        assert result.text.startswith(heal), (prompt, result.text)  # "" fails too


@pytest.mark.parametrize("kind", DRAFT_KINDS)
def test_leaning_to_the_documents_words_stays_lossless(parts, kind):
    """With `words`, speculative output is still the target's own greedy output under the same
    scores (mask and word bias), and the bias does change what is written. The identical draft
    proposes the target's unbiased choices 4 at a time: a verify row past the first that missed
    the bias would keep them."""
    tok, target, _ = parts
    engine = engine_of_kind(kind, parts)
    engine.fixed_k = 4
    cases = [("class Box:\n    def size(self):\n        ret", {"retina_scan", "return", "retry"}),
             ("import os\n\npath = os.pa", {"pathlib_thing", "pa"}),
             ("def go(post_order_fixers):\n    post_order_f", {"post_order_fixers"})]
    changed = False
    for prompt, words in cases:
        ids, heal = prompt_ids(engine, prompt)
        plain = run(engine.generate(ids, max_new_tokens=N_NEW, constraint=healing(engine, heal), speculative=False), tok, ids)
        leaning = run(engine.generate(ids, max_new_tokens=N_NEW, constraint=healing(engine, heal, words),
                                      speculative=kind != "target"), tok, ids)
        assert leaning.tokens == healed_reference(target, engine, ids, heal, N_NEW, words, WORD_BIAS), prompt
        changed |= leaning.tokens != plain.tokens
    assert changed


def test_the_word_bias_falls_on_tokens_that_leave_the_documents_words():
    texts = ["", "fix", "ers", "_", "a", "app", "applied", "and", "lied", ":", "applied:", " ", "ap"]
    heal = Heal(HealVocab(texts), "fixers_a", words={"fixers_applied", "fixers_apply", "other"})
    assert heal.word == "fixers_a" and heal.words == ["fixers_applied", "fixers_apply"]

    def kept(h):
        return sorted(texts[i] for i in (~h.unlikely(h.rest, h.word)).nonzero().flatten())
    assert kept(heal) == ["fix"]  # re-typing the rest in parts keeps every word open
    heal.accept([texts.index("fix"), texts.index("ers"), texts.index("_")])
    # the rest whole and on into one of the words; not "a" alone (`a` + `pplied` is no split the
    # tokenizer makes), not "and"
    # (and the longest piece of each: "app" for fixers_apply, "applied" but not "ap")
    assert heal.rest == "a" and kept(heal) == ["app", "applied", "applied:"]
    heal.accept([texts.index("app")])
    assert heal.rest == "" and heal.word == "fixers_app"
    assert kept(heal) == ["lied"]  # ":" would end the word as `fixers_app`, none of them
    heal.accept([texts.index("lied")])
    assert heal.word == "fixers_applied" and ":" in kept(heal) and " " in kept(heal)
    heal.accept([texts.index(":")])
    assert heal.word is None  # finished: nothing more leans
    logits = torch.zeros(2, len(texts))
    assert torch.equal(heal.mask(logits, [0]), logits)
    assert Heal(HealVocab(texts), "fixers_a", words={"other"}).word is None  # no word to lean to
    assert Heal(HealVocab(texts), " ", words={"fixers_applied"}).word is None


def test_document_words_are_the_names_the_typed_word_can_become():
    source = "def fixers_applied(fixers):\n    return fixers_a\n\nfixers_after = 1\nfixers_ab.x"
    cursor = source.index("fixers_a\n") + len("fixers_a")
    assert document_words(source, cursor, "fixers_a") == {"fixers_applied", "fixers_after", "fixers_ab"}
    assert document_words(source, cursor, " fixers_a") == {"fixers_applied", "fixers_after", "fixers_ab"}
    assert document_words(source, cursor, "rs_a") == set()  # more was typed than backed up
    assert document_words(source, cursor, "\n    ") == set()
    mid = source.index("fixers_applied") + 3  # in the middle of a word: its own text is left out
    assert "fixers_applied" not in document_words(source, mid, "fix")
    far = "fixers_far = 0\n" + "#\n" * WORDS_WINDOW + source  # a huge file: only a window is read
    assert document_words(far, len(far) - len(source) + cursor, "fixers_a") == \
        {"fixers_applied", "fixers_after", "fixers_ab"}


def test_no_extra_space_after_indentation(parts):
    """Issue 11: at an indented empty line the tiny pair answered ' # ...' (a 5-space indent once
    accepted): the prompt's last token was '\\n    ' and the model then began with a space."""
    tok, target, draft = parts
    engine = make_engine(target, draft, tok)
    builder = ContextBuilder(engine.count_tokens, 1024, fim_tokens=engine.fim_tokens)
    for source in ("def add(a, b):\n    \n", "class Box:\n    def size(self):\n        \n"):
        offset = len(source) - 1
        result, text = complete_at(engine, builder, "file:///t.py", source, offset, max_tokens=12)
        indent = source[source.rfind("\n", 0, offset) + 1:offset]
        assert result.tokens and not result.text[:1].isspace(), repr(result.text)
        line = indent + result.text.split("\n")[0]
        assert len(line) - len(line.lstrip(" ")) == len(indent), repr(line)


def test_sampled_text_always_re_types_heal(parts):
    """Sampling draws from the target's constrained distribution: every seed's text starts with
    `heal` (the mask is on the target's side, so a sampled draft outside it is rejected)."""
    tok, target, draft = parts
    engine = make_engine(target, draft, tok, drafter="model")
    engine.fixed_k = 2  # draft every step, so rejection sampling sees masked rows
    for prompt in PROMPTS:
        ids, heal = prompt_ids(engine, prompt)
        for seed in range(8):
            result = run(engine.generate(ids, max_new_tokens=6, constraint=healing(engine, heal), temperature=1.0, seed=seed),
                         tok, ids)
            assert result.text.startswith(heal), (prompt, seed, result.text)
            if heal.rsplit("\n", 1)[-1].strip() == "" and result.text.startswith(heal):
                # indent as typed: the token that covers the typed indentation does not lengthen
                # it (a token after it may start with a space when sampled; the postprocess gate
                # never indents again after the editor's indentation)
                covered = ""
                for t in result.tokens:
                    covered += engine.token_texts[t]
                    if len(covered) >= len(heal):
                        break
                assert covered[len(heal):len(heal) + 1] not in (" ", "\t"), (prompt, seed, covered)


def test_allowed_masks_are_computed_once_per_vocabulary_not_per_request():
    """Every keystroke in one word heals the same text: its mask (a pass over the vocabulary) is
    reused by the next request, and the indentation rule keeps its own mask."""
    vocab = HealVocab(["", " a", "  ", "x"])
    first, second = Heal(vocab, " "), Heal(vocab, " ")
    assert first.allowed(" ") is second.allowed(" ")
    assert first.allowed(" ").tolist() == [False, True, False, False]  # typed indent: no longer one
    assert Heal(vocab, "a ").allowed(" ").tolist() == [False, True, True, False]  # mid-line: any


def test_allowed_mask_equals_a_pass_over_the_whole_vocabulary(parts):
    """The mask reads a sorted range and the rest's prefixes; every id it leaves out must be one
    the rule (advance, then a re-typeable rest) rejects, on a real vocabulary and typed text."""
    from codespec_lsp.completion.heal import advance
    tok = parts[0]
    engine = make_engine(parts[1], None, tok, drafter="ngram")
    vocab = HealVocab(engine.token_texts)
    source = "def walk(self, node):\n        for child in node.children:\n    retu  x = café_1 \t"
    rests = {source[a:b] for a in range(len(source)) for b in range(a + 1, min(a + 9, len(source) + 1))}
    for rest in sorted(rests):
        for indent in (False, True):
            longest = vocab.longest_prefix(rest)
            lefts = [advance(rest, t, indent, longest) for t in vocab.texts]
            whole = [left is not None and (not left or vocab.retypeable(left, indent)) for left in lefts]
            assert vocab.allowed(rest, indent).tolist() == whole, (rest, indent)


def test_allowed_masks_are_copied_to_the_logits_device_once(monkeypatch):
    """On a GPU the mask is applied to logits there: the copy is kept too, and made from the kept
    CPU mask, not by another pass over the vocabulary ("meta" stands in for a GPU here)."""
    from codespec_lsp.completion import heal
    vocab = heal.HealVocab(["", " a", "  ", "x"])
    on_cpu = vocab.allowed(" ", True)
    passes = []
    monkeypatch.setattr(heal, "advance", lambda *a: passes.append(a))
    on_device = vocab.allowed(" ", True, "meta")
    assert on_device.device.type == "meta" and on_device.shape == on_cpu.shape
    assert vocab.allowed(" ", True, torch.device("meta")) is on_device
    assert vocab.allowed(" ", True, "cpu") is on_cpu and passes == []


BYTE_PIECE_PROMPTS = ["menu['café", "x = café", "'日本", "'😀"]  # the tiny vocabulary spells é, 日, 😀 in bytes


def test_prompt_ids_never_backs_up_over_a_character_only_byte_pieces_spell(parts):
    """Issue 28, bug 1: byte pieces read as "" and are never allowed, so a heal holding `é` left
    the first row all -inf (greedy took id 0 and dropped the text, sampling raised on NaN)."""
    tok, target, draft = parts
    engine = make_engine(target, draft, tok)
    vocab = vocab_of(engine)
    assert not any(vocab.retypeable(c) for c in "é日😀")
    for prompt in BYTE_PIECE_PROMPTS:
        ids, heal = prompt_ids(engine, prompt)
        assert not any(c in heal for c in "é日本😀"), (prompt, heal)
        assert (ids, heal) == (engine.encode(prompt), "") or vocab.retypeable(heal)
    ids, heal = prompt_ids(engine, "x = café + coun")  # a later word still heals
    assert heal == " coun" and vocab.retypeable(heal)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_byte_piece_character_before_the_cursor_completes_as_if_unhealed(parts, temperature):
    """`menu['café` and the rest: no crash at temperature 0.8, and the tokens are the ones the
    prompt gives unhealed (before: id 0 first at temperature 0, then a throw-away text)."""
    tok, target, draft = parts
    engine = make_engine(target, draft, tok)
    builder = ContextBuilder(engine.count_tokens, 1024, fim_tokens=engine.fim_tokens)
    for source in BYTE_PIECE_PROMPTS:
        result, _ = complete_at(engine, builder, "file:///t.py", source, len(source), max_tokens=6,
                                temperature=temperature, seed=3, copy_weight=0.0)
        ids = engine.encode(builder.build("file:///t.py", source, len(source), ()).text)
        plain = run(engine.generate(ids, max_new_tokens=6, temperature=temperature, seed=3,
                                    lookup_ids=ids), tok, ids)
        assert result.tokens and 0 not in result.tokens, (source, result.tokens)
        if temperature == 0:  # sampled runs differ in adaptive K's state, so in their draws
            assert result.tokens == plain.tokens[:len(result.tokens)], source


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_generation_whose_heal_no_token_can_retype_ends(parts, temperature):
    """A caller passing such a heal anyway: the generation ends with nothing, no NaN, no id 0."""
    tok, target, draft = parts
    engine = make_engine(target, draft, tok)
    ids = engine.encode("x = caf")
    result = run(engine.generate(ids, max_new_tokens=6, constraint=healing(engine, "é"), temperature=temperature, seed=1),
                 tok, ids)
    assert result.tokens == [] and result.stop_reason == "heal"


def test_a_token_covering_part_of_heal_must_leave_a_retypeable_rest():
    """`caf` covers part of `café` but leaves `é`, which no token re-types: not allowed, so no
    row ends all -inf after it; with `e` in the vocabulary the same split is allowed."""
    spelled = HealVocab(["ca", "caf", "f", "", "", "x"])
    assert not spelled.retypeable("café") and not spelled.allowed("café", False).any()
    assert Heal(spelled, "café").stuck
    whole = HealVocab(["ca", "caf", "f", "é", "x"])
    assert whole.retypeable("café") and whole.allowed("café", False).tolist() == [False, True, False,
                                                                                    False, False]
    assert not Heal(whole, "café").stuck


def test_real_byte_level_vocabulary_heals_only_what_it_can_retype(smol_folder):
    """SmolLM2-135M's byte-level BPE: 日 and 😀 are byte pieces there, which no token re-types."""
    from codespec_lsp.engine.models import load_model, load_tokenizer
    tok = load_tokenizer(smol_folder)
    engine = make_engine(load_model(smol_folder, device="cpu", dtype=torch.float32), None, tok,
                         drafter="ngram")
    vocab = vocab_of(engine)
    assert vocab.retypeable("café") and not vocab.retypeable("日") and not vocab.retypeable("😀")
    for prompt in ("'日本", "'😀"):
        ids, heal = prompt_ids(engine, prompt)
        assert vocab.retypeable(heal) if heal else ids == engine.encode(prompt)
        result = run(engine.generate(ids, max_new_tokens=3, constraint=healing(engine, heal), temperature=0.8, seed=0), tok, ids)
        assert result.tokens and result.text.startswith(heal), (prompt, heal, result.text)


def test_word_bias_zero_turns_the_lean_off_in_the_engine(parts):
    """The engine's Heal gets `word_bias`: 0 writes what no names would, the default leans."""
    from codespec_lsp.config import SettingsLayers
    tok, target, draft = parts
    engine = make_engine(target, draft, tok)
    ids, heal = prompt_ids(engine, "def go(post_order_fixers):\n    post_order_f")
    words = {"post_order_fixers"}
    plain = run(engine.generate(ids, max_new_tokens=N_NEW, constraint=healing(engine, heal)), tok, ids)
    off = run(engine.generate(ids, max_new_tokens=N_NEW, constraint=healing(engine, heal, words, 0.0)), tok, ids)
    on = run(engine.generate(ids, max_new_tokens=N_NEW, constraint=healing(engine, heal, words)), tok, ids)
    assert off.tokens == plain.tokens and on.tokens != plain.tokens
    assert on.tokens == healed_reference(target, engine, ids, heal, N_NEW, words, WORD_BIAS)
    layers = SettingsLayers()
    errors, _ = layers.set_init({"wordBias": 0})
    assert not errors and layers.effective().word_bias == 0.0
    errors, _ = layers.set_workspace({"codespec": {"wordBias": -1}})
    assert errors and "wordBias" in errors[0] and layers.effective().word_bias == 0.0


def test_opening_after_indentation_is_the_piece_the_tokenizer_writes_before_a_word():
    texts = ["\n", "\n   ", "\n    ", " if", "x", "\n      "]
    vocab = HealVocab(texts)
    # "\n    " + "if" is written "\n   " + " if": that piece is the free first draft
    assert Heal(vocab, "\n    ").opening == [1]
    assert Heal(vocab, "\n     ").opening == [2]
    assert Heal(vocab, "\n        ").opening == []  # the longest piece leaves 2 spaces: no guess
    assert Heal(vocab, "x").opening == []             # inside a word: the model's to choose
    line = Heal(vocab, "\n    ")
    line.accept([1])
    assert line.opening == []                          # once it is typed there is nothing to guess

