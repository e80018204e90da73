"""The free drafters: prompt lookup's opening, and the short-match source beside the long one."""

from __future__ import annotations

from codespec_lsp.engine.drafters import NgramDrafter
from engine_helpers import make_engine, tiny_parts


def test_ngram_drafter_proposes_the_opening_first_then_what_followed_it():
    prompt = [5, 6, 7, 9, 8, 5, 6, 7]          # earlier: 5 6 7 9 8; the prompt ends in 5 6 7
    ngram = NgramDrafter(min_match=2, max_match=3)
    ngram.begin(None, prompt, [], opening=[9])
    assert ngram.propose(prompt, 3).tokens == [9, 8, 5]  # 9, then what followed 6 7 9 before
    assert ngram.propose(prompt, 1).tokens == [9]
    assert ngram.propose(prompt + [4], 2).tokens == []    # past the first token: lookup only
    ngram.begin(None, prompt, [])
    assert ngram.propose(prompt, 2).tokens == [9, 8]      # no opening: plain lookup


def test_short_matches_are_a_source_of_their_own_after_the_long_ones():
    prompt = [5, 6, 7, 1, 2, 9, 4, 9]           # the last 3 tokens never occurred before; "9" did
    long, short = NgramDrafter(), NgramDrafter(min_match=1, max_match=2, name="ngram_short")
    for d in (long, short):
        d.begin(None, prompt, [])
    assert long.propose(prompt, 2).tokens == []
    assert short.propose(prompt, 2).tokens == [4, 9]  # what followed the earlier 9

    tok, target, _ = tiny_parts()
    engine = make_engine(target, None, tok)
    names = [s.name for s in engine.sources(speculative=True)]
    assert names == ["ngram", "ngram_short"]          # the long lookup is asked first
    assert {"ngram", "ngram_short"} <= set(engine.controllers)  # each with its own adaptive K
