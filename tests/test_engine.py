"""Engine behaviour on real models: lossless greedy for every drafter, exact sampling, the prefix
cache, cancellation. Counts and equality only; no timings."""

from __future__ import annotations

import itertools
import threading
from collections import Counter

import pytest
import torch

from codespec_lsp.engine.api import CancelToken
from codespec_lsp.engine.engine import FIRST_STEP_PROMPT
from codespec_lsp.engine.kvcache import PrefixCache
from engine_helpers import (N_NEW, PROMPTS, SOURCE, generate_text, prefill_text, make_engine,
                            sampled_pairs_chi_square, random_draft_like, reference_greedy, tiny_parts,
                            toy_pair)

pytestmark = pytest.mark.slow

@pytest.fixture(scope="module")
def parts():
    return tiny_parts()


@pytest.fixture(scope="module")
def references(parts):
    tok, target, _ = parts
    engine = make_engine(target, None, tok)
    return {name: reference_greedy(target, tok, engine, text, N_NEW) for name, text in PROMPTS.items()}


def _drafts(parts):
    tok, target, draft = parts
    return {
        "embedded": (draft, "model"),
        "identical": (target, "model"),
        "random": (random_draft_like(target), "model"),
        "ngram": (None, "ngram"),
        "combined": (draft, "auto"),
    }


@pytest.mark.parametrize("draft_kind", ["embedded", "identical", "random", "ngram", "combined"])
@pytest.mark.parametrize("reuse", [False, True])
def test_greedy_equals_target_generate(parts, references, draft_kind, reuse):
    tok, target, _ = parts
    draft, drafter = _drafts(parts)[draft_kind]
    engine = make_engine(target, draft, tok, drafter=drafter, prefix_cache=reuse)
    totals = Counter()
    for name, prompt in PROMPTS.items():
        if reuse:  # warm the cache with a shorter version of the same text first
            generate_text(engine, prompt[: len(prompt) * 2 // 3], max_new_tokens=4)
        result = generate_text(engine, prompt, max_new_tokens=N_NEW)
        assert result.tokens == references[name], (draft_kind, name)
        assert not result.cancelled
        assert (result.reused_tokens > 0) == reuse
        totals.update(proposed=result.proposed, accepted=result.accepted)
    if draft_kind == "identical":
        assert totals["proposed"] > 0 and totals["accepted"] == totals["proposed"]
    if draft_kind == "random":
        assert totals["accepted"] <= 0.2 * max(totals["proposed"], 1)


def test_draft_model_runs_one_forward_per_drafted_token(parts, references):
    # The tokens accepted in a step ride along with the next step's first draft forward:
    # a separate catch-up forward per step would make the draft cost k + 1 forwards for k tokens.
    tok, target, _ = parts
    engine = make_engine(target, target, tok, drafter="model")
    prefill_text(engine, PROMPTS["medium"])
    result = generate_text(engine, PROMPTS["medium"], max_new_tokens=N_NEW)
    assert result.tokens == references["medium"]
    assert result.proposed > 0 and result.draft_forwards == result.proposed


def test_a_new_prompts_draft_catch_up_is_prefill_not_the_first_steps_drafting(parts, references):
    # Counted as the first step's drafting, a whole prompt's catch-up read as a draft many
    # times dearer per token than it is (what adaptive K and the stats read).
    tok, target, _ = parts
    engine = make_engine(target, target, tok, drafter="model")
    engine.fixed_k = 3  # every step drafts (adaptive K starts the draft model at 0)
    drafter, behind = engine.model_drafter, []
    propose = drafter.propose
    drafter.propose = lambda tokens, *a: behind.append(len(tokens) - len(drafter.kv)) or propose(tokens, *a)
    result = generate_text(engine, PROMPTS["long"], max_new_tokens=N_NEW)  # nothing cached
    assert result.tokens == references["long"] and result.reused_tokens == 0
    # the first step catches up with the prompt's last few tokens, each later one with the last
    # step's (3 drafts and the target's token)
    assert len(behind) > 1 and behind[0] <= FIRST_STEP_PROMPT and max(behind) <= 3 + 1, behind
    # and its forwards are not drafting forwards: one per drafted token, as with a warm cache
    assert result.draft_forwards == result.proposed > 0


def test_fixed_k_proposes_k_every_step(parts, references):
    tok, target, _ = parts
    engine = make_engine(target, target, tok, drafter="model")
    engine.fixed_k = 3
    result = generate_text(engine, PROMPTS["medium"], max_new_tokens=N_NEW)
    assert result.tokens == references["medium"]
    # An identical draft is always right, so every step yields its 3 drafts plus the target's token.
    assert result.accepted == result.proposed
    assert result.target_forwards == -(-len(result.tokens) // 4)


def test_target_only_runs_one_forward_per_token(parts, references):
    tok, target, draft = parts
    engine = make_engine(target, draft, tok)
    result = generate_text(engine, PROMPTS["medium"], max_new_tokens=N_NEW, speculative=False)
    assert result.tokens == references["medium"]
    assert result.target_forwards == len(result.tokens) and result.draft_forwards == 0
    assert result.proposed == 0


def test_sampling_follows_target_distribution():
    """Two sampled tokens from a toy 6-symbol pair, against the target's exact joint distribution."""
    tok, target, draft = toy_pair(vocab=6)
    engine = make_engine(target, draft, tok, drafter="model", prefix_cache=False)
    engine.fixed_k = 1  # always draft: both sampled tokens go through the rejection rule
    prompt = "w1 w2"
    ids = engine.encode_prompt(prompt, reserve=16)
    with torch.no_grad():
        first = torch.softmax(target(torch.tensor([ids])).logits[0, -1], -1)
        exact = {}
        for a in range(6):
            second = torch.softmax(target(torch.tensor([ids + [a]])).logits[0, -1], -1)
            for b in range(6):
                exact[(a, b)] = float(first[a] * second[b])
    # Pearson chi-square over the 36 outcomes (cells with tiny expectation pooled).
    chi2 = sampled_pairs_chi_square(engine, prompt, exact)
    assert chi2 < 80.0, chi2  # > 99.9th percentile of chi-square with <= 36 degrees of freedom
    with torch.no_grad():
        q = torch.softmax(draft(torch.tensor([ids])).logits[0, -1], -1)
    # The draft's own distribution is far from the target's: the test would see a wrong rule.
    assert 0.5 * float((q - first).abs().sum()) > 0.2


def test_one_character_more_prefills_only_a_few_tokens(parts):
    tok, target, draft = parts
    engine = make_engine(target, draft, tok)
    text = SOURCE[:5000]
    generate_text(engine, text, max_new_tokens=4)
    for extra in "def wrap(":
        text += extra
        result = generate_text(engine, text, max_new_tokens=4)
        assert result.reused_tokens > 500
        assert result.prefill_tokens <= 4, (extra, result.prefill_tokens)


def test_cache_reuse_matches_cold_start(parts):
    tok, target, draft = parts
    warm = make_engine(target, draft, tok)
    cold = make_engine(target, draft, tok, prefix_cache=False)
    for cut in (2000, 2400, 1800, 3000):  # extend, branch back, extend again
        a = generate_text(warm, SOURCE[:cut], max_new_tokens=12)
        b = generate_text(cold, SOURCE[:cut], max_new_tokens=12)
        assert a.tokens == b.tokens
        assert b.reused_tokens == 0
    assert a.reused_tokens > 0


def test_prefix_cache_byte_bound_evicts(parts):
    tok, target, _ = parts
    cache = PrefixCache(target, max_bytes=1)  # any real entry is over budget
    kv = cache.acquire("a", [1, 2, 3])
    engine = make_engine(target, None, tok)
    one = engine.target_cache
    texts = {"a": SOURCE[:1500], "b": SOURCE[3000:4500], "c": SOURCE[6000:7500]}
    for key, text in texts.items():
        generate_text(engine, text, max_new_tokens=2, key=key)
    assert len(one) == 3
    per_entry = one.nbytes // 3
    small = make_engine(target, None, tok, cache_bytes=int(per_entry * 2.5))
    for key, text in texts.items():
        generate_text(small, text, max_new_tokens=2, key=key)
    assert len(small.target_cache) == 2 and small.target_cache.nbytes <= small.target_cache.max_bytes
    # the oldest went first: its text now starts cold
    assert generate_text(small, texts["a"], max_new_tokens=2, key="a").reused_tokens == 0
    assert len(kv) == 0 and len(cache.acquire("a", [1, 2, 3])) == 0
    kv.extend([1, 2])
    cache.release("a", kv)
    assert len(cache) == 0  # an entry bigger than the whole budget is not kept


class CancelAfter(CancelToken):
    """Cancels itself at the n-th check: a deterministic point between two forward passes or,
    since the engine also checks before every decoder layer, inside one."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.checks = itertools.count(1)
        self.n = n

    @property
    def cancelled(self) -> bool:
        return next(self.checks) >= self.n or super().cancelled


@pytest.mark.parametrize("after", [1, 3, 40, 200])  # before anything, after a chunk, mid-prefill, decoding
def test_cancel_mid_generation_keeps_caches_valid(parts, references, after):
    tok, target, draft = parts
    engine = make_engine(target, draft, tok)
    result = generate_text(engine, PROMPTS["long"], max_new_tokens=N_NEW, cancel=CancelAfter(after))
    assert result.cancelled and result.stop_reason == "cancelled"
    assert result.tokens == references["long"][:len(result.tokens)]
    assert len(result.tokens) < N_NEW
    again = generate_text(engine, PROMPTS["long"], max_new_tokens=N_NEW)
    assert again.tokens == references["long"]
    assert not again.cancelled
    # Prefill chunks run whole (the next keystroke needs them) and stay cached: only a cancel
    # before the first chunk (check 1) leaves nothing. Decode forwards stop between layers.
    assert (again.reused_tokens > 0) == (after > 1)


def test_cancel_from_another_thread_returns(parts):
    """A cancel mid-decode, from another thread, once tokens are coming: the generation stops
    within one target forward (the old test cancelled before the first check)."""
    tok, target, draft = parts
    engine = make_engine(target, draft, tok)
    token, first = CancelToken(), threading.Event()
    ids = engine.encode(PROMPTS["long"])
    gen = engine.generate(ids, max_new_tokens=400, cancel=token)

    def decode() -> None:
        for _ in gen:
            first.set()

    worker = threading.Thread(target=decode)
    worker.start()
    assert first.wait(timeout=60)
    token.cancel()
    forwards_at_cancel = gen.result.target_forwards
    worker.join(timeout=60)
    assert not worker.is_alive() and gen.result.cancelled and gen.result.stop_reason == "cancelled"
    assert forwards_at_cancel >= 1 and 1 <= len(gen.result.tokens) < 400
    assert gen.result.target_forwards - forwards_at_cancel <= 1


def test_stops_on_stop_string_and_stop_fn(parts, references):
    tok, target, draft = parts
    engine = make_engine(target, draft, tok)
    full = tok.decode(references["medium"])
    assert len(full) > 6
    marker = full[3:6]
    result = generate_text(engine, PROMPTS["medium"], max_new_tokens=N_NEW, stop=[marker])
    assert result.stop_reason == "stop" and result.text == full[:full.find(marker)]
    cut = generate_text(engine, PROMPTS["medium"], max_new_tokens=N_NEW, stop_fn=lambda t: 2 if len(t) > 4 else None)
    assert cut.stop_reason == "stop" and cut.text == full[:2] and len(cut.tokens) < N_NEW


def test_a_draft_that_is_never_right_is_soon_left_alone(parts, monkeypatch):
    """Adaptive K falls to 0 after a few rejections and probes ever more rarely: over 96 tokens a
    random draft gets a handful of proposals, and the output is still the target's. The steps'
    clock ticks once a reading, so the costs adaptive K weighs are the same on a busy machine
    (there the real clock once gave the random draft 29 proposals)."""
    from types import SimpleNamespace

    from codespec_lsp.engine import speculative
    ticks = itertools.count()
    monkeypatch.setattr(speculative, "time", SimpleNamespace(perf_counter=lambda: next(ticks) * 1e-3))
    tok, target, _ = parts
    engine = make_engine(target, random_draft_like(target), tok, drafter="model")
    prompt = SOURCE[:900]
    result = generate_text(engine, prompt, max_new_tokens=96)
    assert result.tokens == reference_greedy(target, tok, engine, prompt, 96)
    assert len(result.tokens) == 96 and result.proposed <= 16, result.proposed


def test_counting_a_file_longer_than_the_window_warns_nothing(parts):
    """The context builder counts whole files and cuts them itself; transformers' "indexing errors"
    warning for long files would put a false alarm in the user's log."""
    import logging
    tok, target, _ = parts
    engine = make_engine(target, None, tok)
    text = "value = compute(value)\n" * 2000
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("transformers")  # its own handler, not propagated to the root
    logger.addHandler(handler)
    try:
        n = engine.count_tokens(text)
        ids = engine.encode(text)
    finally:
        logger.removeHandler(handler)
    assert n > target.config.max_position_embeddings and len(ids) == n + 1
    assert not [r for r in records if "indexing errors" in r.getMessage()]
