"""The copy prior (engine/copy_prior.py): a cache n-gram model of the context mixed into the
target's scores. Its counts, the mix, and that speculative decoding stays lossless under it."""

from __future__ import annotations

import math

import pytest
import torch

from codespec_lsp.completion.complete import document_words, prompt_ids, run
from codespec_lsp.completion.heal import WORD_BIAS, Heal
from codespec_lsp.config import SettingsLayers
from codespec_lsp.completion.heal import healing, vocab_of
from codespec_lsp.engine.copy_prior import ORDERS, CopyPrior
from engine_helpers import (DRAFT_KINDS, engine_of_kind, make_engine, sampled_pairs_chi_square, tiny_parts,
                            toy_pair)

# Code that repeats itself, as tests and tables do: the prior has something to copy.
PROMPTS = ["def test_sizes(self):\n    self.assertEqual(size(a), 1)\n    self.assertEqual(size(b), 2)\n"
           "    self.assertEqual(size(c), 3)\n    self.assert",
           "x = [\n    ('one', 1),\n    ('two', 2),\n    ('three', 3),\n    ('",
           "import os\n\npath = os.path.join(root, name)\nbase = os.path.join(root, "]
N_NEW = 16
WEIGHT = 0.5


def copy_probs(tokens: list[int], vocab: int, orders=ORDERS) -> torch.Tensor:
    """p_copy by brute force: per order n, what followed every earlier occurrence of the last n
    tokens, as shares; averaged over the orders that occurred (all zero when none did)."""
    rows = []
    for n in orders:
        key = tokens[-n:]
        followers = [tokens[j] for j in range(n, len(tokens)) if tokens[j - n:j] == key]
        if followers:
            rows.append(torch.bincount(torch.tensor(followers), minlength=vocab).float() / len(followers))
    return torch.stack(rows).mean(0) if rows else torch.zeros(vocab)


def copy_reference(target, engine, ids: list[int], n: int, weight: float) -> list[int]:
    """The target's own greedy decoding under the mixed scores, one full forward per token; the
    mix stops once the new text holds a newline (the prior scores the first line only)."""
    out: list[int] = []
    with torch.no_grad():
        for _ in range(n):
            logits = target(torch.tensor([ids + out])).logits[0, -1, :engine.vocab_size]
            probs = torch.softmax(logits.float(), -1)
            copy = copy_probs(ids + out, engine.vocab_size)
            first_line = "\n" not in "".join(engine.token_texts[t] for t in out)
            mixed = (1 - weight) * probs + weight * copy if copy.sum() > 0 and first_line else probs
            token = int(mixed.argmax())
            if token in engine.stop_ids:
                break
            out.append(token)
    return out


@pytest.fixture(scope="module")
def parts():
    return tiny_parts()


def test_the_copy_distribution_averages_what_followed_each_order():
    seq = [5, 1, 2, 5, 1, 3, 7, 1]
    prior = CopyPrior(orders=(1, 2))
    prior._index(seq)
    # order 1: after 1 came 2 and 3; order 2, (7, 1): never before, so it does not count
    assert prior.distribution(seq) == {2: 0.5, 3: 0.5}
    assert prior.distribution([9]) == {}  # nothing matches: the target alone
    seq = [4, 6, 1, 9, 6, 2, 4, 6]
    prior = CopyPrior(orders=(1, 2))
    prior._index(seq)
    # order 1, (6,): 1 then 2; order 2, (4, 6): 1 only. Each order's shares, averaged.
    assert prior.distribution(seq) == pytest.approx({1: (1 / 2 + 1) / 2, 2: (1 / 2) / 2})
    # positions past the index (drafted, not accepted yet) count the same
    partly = CopyPrior(orders=(1, 2))
    partly._index(seq[:3])
    assert partly.distribution(seq) == pytest.approx(prior.distribution(seq))


def test_drafted_tokens_count_as_if_accepted():
    """Row i of a verify forward must score what a token-by-token decode would, once drafted[:i]
    had been accepted: their n-grams count too."""
    seq, drafted, vocab = [3, 1, 2, 3, 1, 4, 3, 1], [2, 3, 1, 4], 6
    logits = torch.randn(len(drafted) + 1, vocab, generator=torch.Generator().manual_seed(0))
    mixed = CopyPrior(WEIGHT).mix(logits, seq, drafted)
    for i in range(len(drafted) + 1):
        alone = CopyPrior(WEIGHT).mix(logits[i:i + 1], seq + drafted[:i], [])
        assert torch.allclose(mixed[i], alone[0]), i
        copy = copy_probs(seq + drafted[:i], vocab)
        assert copy.sum() > 0, i  # every row has a match here: each one is mixed
        want = (1 - WEIGHT) * torch.softmax(logits[i], -1) + WEIGHT * copy
        assert torch.allclose(mixed[i].exp(), want, atol=1e-6), i
    unmatched = torch.randn(1, vocab)
    assert torch.equal(CopyPrior(WEIGHT).mix(unmatched, [0, 1, 2, 3], []), unmatched)


def test_the_mix_is_a_distribution_that_keeps_ruled_out_tokens_out():
    prior = CopyPrior(WEIGHT)
    seq = [1, 2, 3, 1, 2, 4, 1, 2]  # after (1, 2): 3 and 4
    logits = torch.zeros(1, 6)
    logits[0, 4] = float("-inf")  # e.g. token healing forbids 4
    mixed = prior.mix(logits, seq, [])
    assert math.isclose(float(torch.logsumexp(mixed[0], -1)), 0.0, abs_tol=1e-5)
    assert mixed[0, 4] == float("-inf")  # its copy share goes to 3, the allowed one
    assert math.isclose(float(mixed[0, 3].exp()), 0.5 / 5 + 0.5, rel_tol=1e-5)
    assert CopyPrior(0.0).mix(logits, seq, []) is logits
    only_ruled_out = torch.zeros(1, 6)
    only_ruled_out[0, [3, 4]] = float("-inf")
    assert torch.equal(prior.mix(only_ruled_out, seq, []), only_ruled_out)


def test_the_prior_scores_the_first_line_only():
    """Past the first line a copy is whole lines the file already has. A newline in a drafted
    token ends the mix for the rows after it, as an accepted one does; the newline that token
    healing re-types first (the cursor's indentation) does not count."""
    breaks = {9: 1}  # id 9 writes a newline
    seq = [9, 1, 2, 3, 9, 1, 2, 3, 9, 1, 2]  # the line "1 2 3", twice, and a third one begun
    drafted = [3, 9, 1, 2]
    logits = torch.zeros(len(drafted) + 1, 10)

    def mixed_rows(prior: CopyPrior, tokens: list[int], draft: list[int]) -> list[bool]:
        out = prior.mix(logits[:len(draft) + 1], tokens, draft)
        return [not torch.equal(out[i], logits[i]) for i in range(len(draft) + 1)]
    assert mixed_rows(CopyPrior(WEIGHT), seq, drafted) == [True] * 5  # no limit without line_breaks
    assert mixed_rows(CopyPrior(WEIGHT, line_breaks=breaks, prompt_len=len(seq)), seq, drafted) == \
        [True, True, False, False, False]
    assert mixed_rows(CopyPrior(WEIGHT, line_breaks=breaks, prompt_len=len(seq), typed_breaks=1),
                      seq, drafted) == [True] * 5
    prior = CopyPrior(WEIGHT, line_breaks=breaks, prompt_len=len(seq))
    assert mixed_rows(prior, seq, []) == [True]
    assert mixed_rows(prior, seq + drafted, []) == [False]  # the same newline, once accepted


def test_the_copy_weight_setting_is_read_in_camel_case_and_checked():
    layers = SettingsLayers()
    errors, _ = layers.set_init({"copyWeight": 0})
    assert not errors and layers.effective().copy_weight == 0.0
    errors, _ = layers.set_workspace({"codespec": {"copyWeight": 1.5}})
    assert errors and "copyWeight" in errors[0]
    assert layers.effective().copy_weight == 0.0  # the bad value is dropped, the good one stays


@pytest.mark.slow
@pytest.mark.parametrize("kind", DRAFT_KINDS)
def test_speculative_output_is_the_greedy_output_under_the_prior(parts, kind):
    """Whatever drafts, the tokens are the greedy choice of the mixed scores, by hand; and the
    prior does change what is written. The identical draft proposes the target's unmixed
    choices 4 at a time, so a verify row that missed the mix would keep them."""
    tok, target, _ = parts
    engine = engine_of_kind(kind, parts)
    engine.fixed_k = 4
    changed = False
    for prompt in PROMPTS:
        ids = engine.encode(prompt)
        plain = run(engine.generate(ids, max_new_tokens=N_NEW, speculative=False), tok, ids)
        mixed = run(engine.generate(ids, max_new_tokens=N_NEW, copy_weight=WEIGHT,
                                    speculative=kind != "target"), tok, ids)
        assert mixed.tokens == copy_reference(target, engine, ids, N_NEW, WEIGHT), (kind, prompt)
        changed |= mixed.tokens != plain.tokens
    assert changed


def server_path_reference(target, engine, ids: list[int], heal: str, words, n: int,
                          weight: float) -> list[int]:
    """Greedy decoding under the server's scores, one full forward and one row per token: the
    healing mask, the lean to `words` (Heal's single-row masks), then the copy prior by brute
    force over the tokens the mask leaves, on the first line of new text only."""
    healing, out = Heal(vocab_of(engine), heal, words), []
    with torch.no_grad():
        for _ in range(n):
            logits = target(torch.tensor([ids + out])).logits[0, -1, :engine.vocab_size].float()
            if healing.rest:
                logits[~healing.allowed(healing.rest)] = float("-inf")
            if healing.word is not None:
                logits -= WORD_BIAS * healing.unlikely(healing.rest, healing.word).float()
            copy = copy_probs(ids + out, engine.vocab_size) * torch.isfinite(logits)
            breaks = sum(vocab_of(engine).texts[t].count("\n") for t in out)
            probs = torch.softmax(logits, -1)
            if copy.sum() > 0 and breaks <= heal.count("\n"):
                probs = (1 - weight) * probs + weight * copy / copy.sum()
            token = int(probs.argmax())
            if token in engine.stop_ids:
                break
            out.append(token)
            healing.accept([token])
    return out


@pytest.mark.slow
@pytest.mark.parametrize("kind", DRAFT_KINDS)
def test_on_the_servers_path_speculative_equals_the_by_hand_reference(parts, kind):
    """Healing, the name lean and the copy prior together, as complete_at asks for them: every
    drafter's tokens are the by-hand greedy decoding of those scores (issue 28: the old test
    compared two runs through the same `step`, so a wrong mask or mix passed on both sides)."""
    tok, target, _ = parts
    engine = engine_of_kind(kind, parts)
    engine.fixed_k = 4
    leaned = False
    for prompt in PROMPTS:
        ids, heal = prompt_ids(engine, prompt)
        words = document_words(prompt, len(prompt), heal)
        leaned |= bool(words)
        result = run(engine.generate(ids, max_new_tokens=N_NEW, constraint=healing(engine, heal, words),
                                     copy_weight=WEIGHT, speculative=kind != "target"), tok, ids)
        assert result.tokens == server_path_reference(target, engine, ids, heal, words, N_NEW,
                                                      WEIGHT), (kind, prompt)
        assert result.text.startswith(heal), (prompt, result.text)
    assert leaned


def test_sampling_follows_the_mixed_distribution():
    """Two sampled tokens from a toy 6-symbol pair with the prior on, against the exact joint
    distribution of the mixed scores (the rejection rule runs against them)."""
    tok, target, draft = toy_pair(vocab=6)
    engine = make_engine(target, draft, tok, drafter="model", prefix_cache=False)
    engine.fixed_k = 1  # always draft: both sampled tokens go through the rejection rule
    prompt = "w1 w2 w3 w1 w2 w4 w1 w2"  # after (w1 w2): w3 or w4; after w2: w3, w4, or w1 w2 again
    ids = engine.encode_prompt(prompt, reserve=16)

    def mixed(tokens: list[int]) -> torch.Tensor:
        with torch.no_grad():
            probs = torch.softmax(target(torch.tensor([tokens])).logits[0, -1], -1)
        copy = copy_probs(tokens, 6)
        return (1 - WEIGHT) * probs + WEIGHT * copy if copy.sum() > 0 else probs
    first = mixed(ids)
    exact = {(a, b): float(first[a] * mixed(ids + [a])[b]) for a in range(6) for b in range(6)}
    chi2 = sampled_pairs_chi_square(engine, prompt, exact, copy_weight=WEIGHT)
    assert chi2 < 80.0, chi2  # > 99.9th percentile of chi-square with <= 36 degrees of freedom
    with torch.no_grad():
        plain = torch.softmax(target(torch.tensor([ids])).logits[0, -1], -1)
    # the prior moves the first token's distribution far: a sampler ignoring it would fail above
    assert 0.5 * float((plain - first).abs().sum()) > 0.2


@pytest.mark.slow
def test_sampling_at_a_temperature_and_top_p_tempers_the_mixed_distribution():
    """At T != 1 and top-p < 1 the sampled distribution is the MIXED one tempered and then cut:
    p ∝ mix^(1/T), then the smallest set of tokens reaching top_p, renormalised (copy_prior.py
    says so); checked against that, exactly, on the toy pair."""
    from codespec_lsp.engine.speculative import adjust_probs
    tok, target, draft = toy_pair(vocab=6)
    engine = make_engine(target, draft, tok, drafter="model", prefix_cache=False)
    engine.fixed_k = 1
    prompt = "w1 w2 w3 w1 w2 w4 w1 w2"
    ids = engine.encode_prompt(prompt, reserve=16)
    temperature, top_p = 0.7, 0.9

    def sampled(tokens: list[int]) -> torch.Tensor:
        with torch.no_grad():
            probs = torch.softmax(target(torch.tensor([tokens])).logits[0, -1], -1)
        copy = copy_probs(tokens, 6)
        mixed = (1 - WEIGHT) * probs + WEIGHT * copy if copy.sum() > 0 else probs
        tempered = mixed ** (1 / temperature)
        tempered /= tempered.sum()
        order = tempered.argsort(descending=True)
        before = tempered[order].cumsum(0) - tempered[order]
        kept = torch.zeros(6, dtype=torch.bool)
        kept[order[before <= top_p]] = True
        cut = tempered * kept
        return cut / cut.sum()
    first = sampled(ids)
    exact = {(a, b): float(first[a] * sampled(ids + [a])[b]) for a in range(6) for b in range(6)}
    chi2 = sampled_pairs_chi_square(engine, prompt, exact, temperature=temperature,
                                    copy_weight=WEIGHT, top_p=top_p)
    assert chi2 < 80.0, chi2
    # the by-hand form is adjust_probs over log(mix): the same numbers, another way round
    with torch.no_grad():
        probs = torch.softmax(target(torch.tensor([ids])).logits[0, -1], -1)
    mix = (1 - WEIGHT) * probs + WEIGHT * copy_probs(ids, 6)
    assert torch.allclose(adjust_probs(mix.log()[None], temperature, top_p)[0], first, atol=1e-5)
