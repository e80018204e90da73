"""Token healing (SEAM.md `heal`): complete.prompt_ids backs up over the last token of a prompt
ending mid-line, and the engine constrains its first token(s) to re-type it, losslessly."""

from __future__ import annotations

import pytest
import torch

from codespec_lsp.complete import HEAL_MAX_TOKENS, complete_at, prompt_ids, run
from codespec_lsp.context import ContextBuilder
from engine_helpers import make_engine, random_draft_like, tiny_parts

pytestmark = pytest.mark.slow

PROMPTS = ["def add(a, b):\n    ", "import os\n\npath = os.pa",
           "class Box:\n    def size(self):\n        ret"]
N_NEW = 16


@pytest.fixture(scope="module")
def parts():
    return tiny_parts()


def healed_reference(target, engine, ids: list[int], heal: str, n: int) -> list[int]:
    """The target's own greedy decoding under the constraint, by hand: while part of `heal` is
    still to come, only tokens whose text starts with the rest, or is a non-empty prefix of it;
    when `heal` ends in indentation, a token covering it does not go on with a space or tab; a
    token covering part of it and stopping inside a word is the longest such token."""
    texts, rest, out = engine.heal_vocab.texts, heal, []
    indent = heal.rsplit("\n", 1)[-1] != "" and not heal.rsplit("\n", 1)[-1].strip()

    def allowed(t: str) -> bool:
        if t.startswith(rest):
            return not (indent and t[len(rest):len(rest) + 1] in (" ", "\t"))
        if not t or not rest.startswith(t):
            return False
        longest = max(len(u) for u in texts if u and len(u) < len(rest) and rest.startswith(u))
        return len(t) == longest or not (rest[len(t)].isalnum() or rest[len(t)] == "_")

    with torch.no_grad():
        for _ in range(n):
            logits = target(torch.tensor([ids + out])).logits[0, -1, :engine.vocab_size]
            if rest:
                ok = torch.tensor([allowed(t) for t in texts])
                logits = logits.masked_fill(~ok, float("-inf"))
            token = int(logits.argmax())
            if token in engine.stop_ids:
                break
            out.append(token)
            if rest:
                rest = "" if texts[token].startswith(rest) else rest[len(texts[token]):]
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
    texts = engine.heal_vocab.texts
    for prompt, word in [("class Box:\n    def size(self):\n        ret", " ret"),
                         ("        post_order_f", " post_order_f"), ("x = os.pa", "pa"),
                         ("if a.b and c", " c")]:
        full = engine.encode(prompt)
        ids, heal = prompt_ids(engine, prompt)
        assert heal == word and full[:len(ids)] == ids and "".join(texts[t] for t in full[len(ids):]) == word
    assert len(engine.encode("        ret")) - len(prompt_ids(engine, "        ret")[0]) == 2  # split here
    long = "x = " + "a" * 400  # a long word: at most HEAL_MAX_TOKENS tokens are backed up
    assert 0 < len(engine.encode(long)) - len(prompt_ids(engine, long)[0]) <= HEAL_MAX_TOKENS


def test_a_token_covering_part_of_a_word_is_the_longest_one():
    """Inside a word only the longest partial cover is open (the tokenizer's own split is never
    " f" + "eatures"); where the rest goes on with a space or symbol, every partial cover is."""
    from codespec_lsp.engine.heal import Heal, HealVocab
    texts = ["", " f", " feature", " features", " featured", "s", " ", "\n", "\n  ", " if", "x."]
    vocab = HealVocab(texts)
    heal = Heal(vocab, " features")
    assert [texts[i] for i in heal.allowed(heal.rest).nonzero().flatten()] == [" feature", " features"]
    heal.accept([texts.index(" feature")])
    assert heal.rest == "s"
    line = Heal(vocab, "\n    ")  # the rest of the indentation may come in any piece
    assert [texts[i] for i in line.allowed(line.rest).nonzero().flatten()] == ["\n", "\n  "]
    assert [texts[i] for i in Heal(vocab, "x.f").allowed("x.f").nonzero().flatten()] == ["x."]


@pytest.mark.parametrize("kind", ["target", "embedded", "identical", "random", "ngram"])
def test_healed_speculative_equals_healed_target_greedy(parts, kind):
    tok, target, draft = parts
    draft_model, drafter = {"target": (None, "ngram"), "embedded": (draft, "model"),
                            "identical": (target, "model"), "random": (random_draft_like(target), "model"),
                            "ngram": (None, "ngram")}[kind]
    engine = make_engine(target, draft_model, tok, drafter=drafter)
    for prompt in PROMPTS:
        ids, heal = prompt_ids(engine, prompt)
        assert heal and prompt.endswith(heal)
        result = run(engine.generate(ids, max_new_tokens=N_NEW, heal=heal,
                                     speculative=kind != "target"), tok, ids)
        assert result.tokens == healed_reference(target, engine, ids, heal, N_NEW), (kind, prompt)
        assert result.text.startswith(heal) or heal.startswith(result.text)


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
            result = run(engine.generate(ids, max_new_tokens=6, heal=heal, temperature=1.0, seed=seed),
                         tok, ids)
            assert result.text.startswith(heal) or heal.startswith(result.text), (prompt, seed, result.text)
            if heal.rsplit("\n", 1)[-1].strip() == "" and result.text.startswith(heal):
                # indent as typed: the token that covers the typed indentation does not lengthen
                # it (a token after it may start with a space when sampled; the postprocess gate
                # never indents again after the editor's indentation)
                covered = ""
                for t in result.tokens:
                    covered += engine.heal_vocab.texts[t]
                    if len(covered) >= len(heal):
                        break
                assert covered[len(heal):len(heal) + 1] not in (" ", "\t"), (prompt, seed, covered)


def test_allowed_masks_are_computed_once_per_vocabulary_not_per_request():
    """Every keystroke in one word heals the same text: its mask (a pass over the vocabulary) is
    reused by the next request, and the indentation rule keeps its own mask."""
    from codespec_lsp.engine.heal import Heal, HealVocab
    vocab = HealVocab(["", " a", "  ", "x"])
    first, second = Heal(vocab, " "), Heal(vocab, " ")
    assert first.allowed(" ") is second.allowed(" ")
    assert first.allowed(" ").tolist() == [False, True, False, False]  # typed indent: no longer one
    assert Heal(vocab, "a ").allowed(" ").tolist() == [False, True, True, False]  # mid-line: any


def test_allowed_masks_are_copied_to_the_logits_device_once(monkeypatch):
    """On a GPU the mask is applied to logits there: the copy is kept too, and made from the kept
    CPU mask, not by another pass over the vocabulary ("meta" stands in for a GPU here)."""
    from codespec_lsp.engine import heal
    vocab = heal.HealVocab(["", " a", "  ", "x"])
    on_cpu = vocab.allowed(" ", True)
    passes = []
    monkeypatch.setattr(heal, "advance", lambda *a: passes.append(a))
    on_device = vocab.allowed(" ", True, "meta")
    assert on_device.device.type == "meta" and on_device.shape == on_cpu.shape
    assert vocab.allowed(" ", True, torch.device("meta")) is on_device
    assert vocab.allowed(" ", True, "cpu") is on_cpu and passes == []
