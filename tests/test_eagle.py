"""The EAGLE draft head (engine/eagle.py): lossless greedy and sampling whatever the head says,
its cache built from the target's real hidden states, files that load only for their target."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from codespec_lsp.engine import hf
from codespec_lsp.engine.api import ModelLoadError
from codespec_lsp.engine.eagle import CATCH_UP_CHUNK, EagleHead, is_eagle_folder, load_head, save_head
from codespec_lsp.engine.kvcache import KV
from engine_helpers import (CORPUS, N_NEW, PROMPTS, generate_text, make_engine, prefill_text, reference_greedy,
                            sampled_pairs_chi_square, tiny_parts, toy_pair)

pytestmark = pytest.mark.slow

@pytest.fixture(scope="module")
def parts():
    return tiny_parts()


@pytest.fixture(scope="module")
def head(parts):
    _, target, _ = parts
    torch.manual_seed(0)
    return EagleHead.for_target(target, torch.arange(2000)).eval()


def eagle_engine(parts, head, **kw):
    tok, target, _ = parts
    return make_engine(target, None, tok, eagle_head=head, **kw)


@pytest.mark.parametrize("drafter", ["model", "auto"])
@pytest.mark.parametrize("reuse", [False, True])
def test_greedy_equals_the_targets_own_output(parts, head, drafter, reuse):
    tok, target, _ = parts
    engine = eagle_engine(parts, head, drafter=drafter, prefix_cache=reuse)
    engine.fixed_k = 3  # draft every step, so every step goes through the head's proposal
    proposed = 0
    for name, prompt in PROMPTS.items():
        if reuse:
            generate_text(engine, prompt[: len(prompt) * 2 // 3], max_new_tokens=4, key=name)
        result = generate_text(engine, prompt, max_new_tokens=N_NEW, key=name)
        assert result.tokens == reference_greedy(target, tok, engine, prompt, N_NEW), name
        proposed += result.proposed
    assert proposed > 0


def test_the_heads_cache_holds_what_the_targets_real_states_give(parts, head):
    """After a generation the head keeps, per document, the entries computed from the target's
    hidden states of the accepted tokens (not its own guesses made while drafting)."""
    _, target, _ = parts
    engine = eagle_engine(parts, head, drafter="model")
    engine.fixed_k = 3
    result = generate_text(engine, PROMPTS["medium"], max_new_tokens=N_NEW, key="doc")
    ids, cache = engine.model_drafter._saved["doc"]
    seq = engine.encode(PROMPTS["medium"]) + result.tokens
    assert ids == seq[1:len(ids) + 1] and len(ids) >= len(seq) - 3
    with torch.no_grad():
        states = target.model(input_ids=torch.tensor([seq])).last_hidden_state
        fresh = hf.new_cache(head.body)
        head(torch.tensor([seq[1:len(ids) + 1]]), states[:, :len(ids)], fresh)
    assert torch.allclose(cache.layers[0].keys, fresh.layers[0].keys, atol=1e-4)


def test_the_head_drafts_at_the_first_step_over_the_prompt_tail_the_target_has_not_run(parts, head):
    """A keystroke's new tokens ride in the first verify (engine.FIRST_STEP_PROMPT): the head
    reads its own states there instead of sitting the step out; the next propose rebuilds those
    entries from the target's real states."""
    from codespec_lsp.engine.eagle import EagleDrafter
    _, target, _ = parts
    ids = torch.randint(3, 500, (30,)).tolist()
    kv = KV(target, keep_states=True)
    kv.extend(ids[:26])  # the last four prompt tokens not run yet
    drafter = EagleDrafter(head, target.config.vocab_size)
    drafter.begin("doc", ids, [], (), kv)
    proposal = drafter.propose(ids, 3, None, None)
    assert len(proposal.tokens) == 3
    assert drafter.real == 26 and len(drafter.ids) == 29 + 2  # 3 tail entries, 2 drafted
    kv.extend(ids[26:])
    drafter.propose(ids, 1, None, None)
    assert drafter.real == len(drafter.ids) == 29  # every entry from real states now
    with torch.no_grad():
        states = target.model(input_ids=torch.tensor([ids])).last_hidden_state
        fresh = hf.new_cache(head.body)
        head(torch.tensor([ids[1:]]), states[:, :-1], fresh)
    assert torch.allclose(drafter.cache.layers[0].keys, fresh.layers[0].keys, atol=1e-4)


def test_greedy_proposals_carry_the_heads_runner_up_and_count_once_per_source(parts, head):
    """The head's second choice for the first token is a branch of the step's tree: a greedy
    proposal names it, a sampled one does not, and the step's counts take the head once."""
    from codespec_lsp.engine.drafters import Sampling
    from codespec_lsp.engine.eagle import RUNNERS_UP, EagleDrafter
    from codespec_lsp.engine.engine import _by_source
    from codespec_lsp.engine.speculative import step
    _, target, _ = parts
    ids = torch.randint(3, 500, (30,)).tolist()
    kv = KV(target, keep_states=True)
    kv.extend(ids[:-1])
    drafter = EagleDrafter(head, target.config.vocab_size)
    drafter.begin("doc", ids, [], (), kv)
    proposal = drafter.propose(ids, 2, None, None)
    state = drafter.catch_up(ids)
    ranked = head.head_ids[head.logits(state).float().topk(1 + RUNNERS_UP).indices].tolist()
    assert proposal.tokens[0] == ranked[0] and proposal.runners_up == ranked[1:]
    assert drafter.propose(ids, 2, Sampling(1.0, 1.0), None).runners_up == []
    out = step(kv, ids, [(drafter, 2)], None, target.config.vocab_size)
    assert [b.tokens for b in out.branches] == [proposal.tokens] + [[t] for t in ranked[1:]]
    proposed, kept, _, won = _by_source(out)["eagle"]
    assert proposed == 2 + RUNNERS_UP and kept == out.kept and won is (out.winner is not None)


def test_a_prefill_brings_the_heads_cache_up_to_the_prompt(parts, head):
    """Opening a file (engine.prefill) catches the head up too: the first completion there drafts
    after a few entries, not after a catch-up over the whole file."""
    _, target, _ = parts
    engine = eagle_engine(parts, head, drafter="model")
    prefill_text(engine, PROMPTS["long"], key="doc")
    seq = engine.encode(PROMPTS["long"])
    ids, cache = engine.model_drafter._saved["doc"]
    assert len(seq) > 2 * CATCH_UP_CHUNK and ids == seq[1:]  # the target ran all but the last token
    with torch.no_grad():
        states = target.model(input_ids=torch.tensor([seq[:-1]])).last_hidden_state
        fresh = hf.new_cache(head.body)
        head(torch.tensor([seq[1:]]), states, fresh)
    assert torch.allclose(cache.layers[0].keys, fresh.layers[0].keys, atol=1e-4)
    engine.fixed_k = 2
    before = engine.model_drafter.forwards
    result = generate_text(engine, PROMPTS["long"], max_new_tokens=8, key="doc")
    # a step: one catch-up forward over the few new real entries, one draft forward past the first
    assert result.proposed > 0 and engine.model_drafter.forwards - before <= 2 * result.target_forwards


def test_the_target_kv_keeps_hidden_states_through_crop_and_copy(parts):
    _, target, _ = parts
    ids = torch.randint(3, 500, (40,)).tolist()
    kv = KV(target, keep_states=True)
    kv.extend(ids[:30])
    kv.crop(20)
    kv.extend(ids[20:25])
    copy = kv.copy(22)
    with torch.no_grad():
        want = target.model(input_ids=torch.tensor([ids[:25]])).last_hidden_state[0]
    assert kv.hidden.shape == (25, target.config.hidden_size)
    assert torch.allclose(kv.hidden, want, atol=1e-4)
    assert torch.allclose(copy.hidden, want[:22], atol=1e-4) and len(copy) == 22


def test_sampling_follows_the_targets_distribution():
    """Two sampled tokens from a toy 6-symbol target, against its exact joint distribution. The
    prompt is cached with its hidden states, so the head drafts the first token, which goes
    through the rejection rule; the second is the target's own."""
    tok, target, _ = toy_pair(vocab=6)
    torch.manual_seed(3)
    head = EagleHead.for_target(target, torch.arange(6)).eval()
    with torch.no_grad():
        head.fc.weight.mul_(4.0)  # a confident, wrong head: the rule has to correct it
    engine = make_engine(target, None, tok, eagle_head=head, drafter="model")
    engine.fixed_k = 1
    prompt = "w1 w2 w3"
    ids = engine.encode_prompt(prompt, reserve=16)
    prefill_text(engine, prompt, key="p")
    with torch.no_grad():
        first = torch.softmax(target(torch.tensor([ids])).logits[0, -1], -1)
        exact = {}
        for a in range(6):
            second = torch.softmax(target(torch.tensor([ids + [a]])).logits[0, -1], -1)
            for b in range(6):
                exact[(a, b)] = float(first[a] * second[b])
    chi2 = sampled_pairs_chi_square(engine, prompt, exact, key="p")
    assert chi2 < 80.0, chi2  # > 99.9th percentile of chi-square with <= 36 degrees of freedom
    assert engine.model_drafter.forwards >= 3000  # the head drafted every first token
    with torch.no_grad():  # and what it drafts from is far from the target: a wrong rule would show
        states = target.model(input_ids=torch.tensor([ids])).last_hidden_state
        q = torch.softmax(head.logits(head(torch.tensor([ids[1:]]), states[:, :-1])[0, -1]), -1)
    assert 0.5 * float((q - first).abs().sum()) > 0.2


def test_a_head_loads_only_for_the_target_it_was_trained_for(parts, head, tmp_path):
    _, target, _ = parts
    save_head(head, tmp_path / "head")
    assert is_eagle_folder(tmp_path / "head") and not is_eagle_folder(tmp_path)
    loaded = load_head(tmp_path / "head", target)
    assert torch.equal(loaded.head_ids, head.head_ids)
    x = torch.randn(1, 5, target.config.hidden_size)
    ids = torch.randint(0, 2000, (1, 5))
    with torch.no_grad():
        assert torch.allclose(loaded(ids, x), head(ids, x), atol=2e-2)  # saved in fp16
    _, other, _ = toy_pair(vocab=6)
    with pytest.raises(ModelLoadError, match="trained for a target"):
        load_head(tmp_path / "head", other)
    (tmp_path / "head" / "model.safetensors").write_bytes(b"broken")
    with pytest.raises(ModelLoadError, match="cannot load the EAGLE draft head"):
        load_head(tmp_path / "head", target)


@pytest.fixture(scope="module")
def smol_engine(smol_folder):
    """The smol preset as it ships (SmolLM2-135M and its EAGLE head)."""
    from codespec_lsp.engine.models import load_engine
    return load_engine("smol", device="cpu")


def test_the_smol_preset_drafts_with_its_eagle_head(smol_engine):
    assert smol_engine.eagle_head is not None and smol_engine.sources(True)[1].name == "eagle"


@pytest.mark.parametrize("scoring", ["preset", "heal_lean_copy"])
def test_the_smol_head_is_lossless_on_the_servers_path(smol_engine, scoring):
    """Greedy output with the shipped head equals the target alone, through the path the server
    runs (token healing backed up, and with the name lean and the copy prior on as well)."""
    from codespec_lsp.bench.engine import completion_points, corpus_files, served
    from codespec_lsp.engine.scoring import SCORING, Scoring
    engine = smol_engine
    engine.scoring = SCORING["smol"] if scoring == "preset" else Scoring(copy_weight=0.5, word_bias=10.0)
    engine.reset_adaptive()
    root = CORPUS.parent / "unseen_tune"
    prompts = completion_points(corpus_files(root), 3, engine, context_tokens=384, seed=5)
    prompts.append(prompts[0] + "re")  # a half-typed word: healing backs it up
    by_source = Counter()
    for prompt in prompts:
        spec = served(engine, prompt, max_new_tokens=20)
        alone = served(engine, prompt, max_new_tokens=20, speculative=False)
        assert spec.tokens == alone.tokens
        by_source.update({name: counts[0] for name, counts in spec.by_source.items()})
    assert by_source["eagle"] > 0
