"""complete.py: incremental detokenization, stop handling, the Generation seam (no model)."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from codespec_lsp.completion.complete import Detokenizer, run
from codespec_lsp.engine.api import Generation, GenerationResult


def sentencepiece_like() -> PreTrainedTokenizerFast:
    """Words with a '▁' for the space before them; the decoder strips the leading space of the
    text, as CodeLlama's does."""
    vocab = {"<s>": 0, "</s>": 1, "▁x": 2, "▁=": 3, "▁1": 4, "\n": 5, "▁y": 6}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="</s>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    backend.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>")


def test_leading_space_survives_decoding():
    tok = sentencepiece_like()
    assert tok.decode([4]) == "1"  # the decoder strips it when the id is decoded alone
    detok = Detokenizer(tok, [0, 2, 3])  # "<s> x ="
    assert detok.add(4) == " 1"
    assert detok.add(6) == " 1 y"


def scripted(tokens: list[int]) -> Generation:
    result = GenerationResult()

    def steps():
        for t in tokens:
            result.tokens.append(t)
            yield t
    return Generation(steps(), result)


def test_run_cuts_at_stop_string_and_closes():
    tok = sentencepiece_like()
    gen = scripted([4, 6, 2, 3])
    result = run(gen, tok, [0, 2, 3], stop=[" y"])
    assert result.text == " 1" and result.stop_reason == "stop"
    assert result.tokens == [4, 6] and gen.done  # nothing generated past the stop


def test_run_drains_to_the_end():
    result = run(scripted([4, 6]), sentencepiece_like(), [0, 2, 3])
    assert result.text == " 1 y" and result.stop_reason == "max_tokens"


def test_whole_words_drops_a_word_the_next_token_may_extend():
    from codespec_lsp.completion.complete import whole_words
    assert whole_words("self.conf") == "self."
    assert whole_words("return ") == "return "
    assert whole_words("x = foo(") == "x = foo("
    assert whole_words("value") == ""
    # a keyword code almost never extends is whole at once; a line-start one only at a line start
    assert whole_words("\n        if") == "\n        if"
    assert whole_words("x = a if b else") == "x = a if b else"
    assert whole_words("    for") == "    for"
    assert whole_words("\n    for") == "\n    for"
    assert whole_words("x = [a for") == "x = [a "
    assert whole_words("elif x is") == "elif x "  # `is` may become `isinstance`
    assert whole_words("my_if") == ""
    assert whole_words("self.return") == "self."  # an attribute: `self.returns`


def test_lookup_ids_tokenizes_a_lookup_text_once_and_hands_out_copies():
    """The lookup text is the same at every keystroke in a line: the ids come from the first
    encode, and a caller changing its list cannot change what the next request gets."""
    from codespec_lsp.completion.complete import lookup_ids

    class Counting:
        calls: list[str] = []

        def encode(self, text: str) -> list[int]:
            self.calls.append(text)
            return [ord(c) for c in text]

    backend = Counting()
    first = lookup_ids(backend, "x = 1")
    first.append(0)
    assert lookup_ids(backend, "x = 1") == [ord(c) for c in "x = 1"]
    assert lookup_ids(backend, "y") == [ord("y")]
    assert backend.calls == ["x = 1", "y"]
