"""engine/cpu_linear.py: the transposed and packed small-batch products are the same linear map, and
installing them on a model changes which kernel runs, never the weights, the keys or the greedy
output."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from codespec_lsp.engine import cpu_linear
from codespec_lsp.engine.models import TINY_DIR, load_model
from engine_helpers import CORPUS, generate_text, make_engine, reference_greedy, tiny_parts


FORMS = (cpu_linear.TRANSPOSED, cpu_linear.PACKED)


@torch.inference_mode()
def test_small_batch_linear_computes_the_same_map_for_every_row_count():
    torch.manual_seed(0)
    for bias in (False, True):
        layer = torch.nn.Linear(48, 80, bias=bias)
        reference = torch.nn.Linear(48, 80, bias=bias)
        reference.load_state_dict(layer.state_dict())
        layer.__class__ = cpu_linear.SmallBatchLinear
        layer.packed = cpu_linear.pack(layer.weight)
        assert layer.packed is not None  # the CPU build CI installs has oneDNN
        for form in FORMS:
            # rows 4, 6 and the long ones keep F.linear: a plan names only the counts that won
            layer.forms = {1: form, 2: form, 3: form, 5: form, cpu_linear.LONG_ROWS: form}
            for rows in (*range(1, 12), 100):
                x = torch.randn(1, rows, 48)
                out = layer(x)
                assert out.shape == (1, rows, 80)
                torch.testing.assert_close(out, reference(x), rtol=1e-5, atol=1e-5)


def test_install_swaps_every_linear_and_keeps_the_model():
    model = load_model(str(TINY_DIR / "target"), device="cpu", dtype=torch.float32)
    # load_model installs it on the CPU; what it chose is kept beside the model
    plan = model.cpu_linear_plan
    assert set(plan) <= {*range(1, cpu_linear.MAX_ROWS + 1), cpu_linear.LONG_ROWS}
    assert set(plan.values()) <= set(FORMS)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(type(m) is cpu_linear.SmallBatchLinear for m in linears)
    # the packed copy of the weights is kept only where a row count uses it
    assert all((m.packed is not None) == (cpu_linear.PACKED in plan.values()) for m in linears)
    keys = set(model.state_dict())

    ids = torch.tensor([[5, 17, 99, 3, 42, 8]])
    with torch.inference_mode():
        cpu_linear._set_forms(linears, {})
        plain = model(input_ids=ids).logits
        for form in FORMS:
            for m in linears:
                m.packed = cpu_linear.pack(m.weight)
            cpu_linear._set_forms(linears, {n: form for n in range(1, 9)})
            torch.testing.assert_close(model(input_ids=ids).logits, plain, rtol=1e-4, atol=1e-4)
    assert set(model.state_dict()) == keys
    # the tied LM head still reads the embedding's storage
    if model.config.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_speculative_greedy_equals_the_target_with_every_row_count_transposed_or_packed():
    tok, target, draft = tiny_parts()
    prompt = (CORPUS / "textwrap.py").read_text()[:900]
    for form in FORMS:
        for model in (target, draft):
            linears = [m for m in model.modules() if isinstance(m, cpu_linear.SmallBatchLinear)]
            for m in linears:
                m.packed = cpu_linear.pack(m.weight)
            cpu_linear._set_forms(linears, {n: form for n in (*range(1, 9), cpu_linear.LONG_ROWS)})
        want = reference_greedy(target, tok, make_engine(target, None, tok), prompt, 24)
        for draft_model, drafter in ((draft, "model"), (target, "model"), (None, "ngram")):
            result = generate_text(make_engine(target, draft_model, tok, drafter=drafter), prompt,
                                   max_new_tokens=24)
            assert result.tokens == want, (form, drafter)
            assert result.proposed > 0



def small_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4)
    return LlamaForCausalLM(config).eval()


def test_a_plan_is_timed_once_and_then_read_from_the_cache(tmp_path, monkeypatch):
    cache = tmp_path / "cpu_linear.json"
    timed = []
    real = cpu_linear._time_forms
    monkeypatch.setattr(cpu_linear, "_time_forms", lambda *a: timed.append(1) or real(*a))
    first = cpu_linear.install(small_llama(), cache)
    assert len(timed) == 1 and cache.exists()
    # another load of the same shape: the kept plan, installed, without timing anything
    model = small_llama()
    assert cpu_linear.install(model, cache) == first and len(timed) == 1
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert all(type(m) is cpu_linear.SmallBatchLinear and m.forms == first for m in linears)
    # another machine, thread count or PyTorch: another key, timed again, both kept
    monkeypatch.setattr(cpu_linear, "_cpu_name", lambda: "another CPU")
    cpu_linear.install(small_llama(), cache)
    assert len(timed) == 2 and len(json.loads(cache.read_text())) == 2


def test_a_kept_packed_plan_packs_the_weights_and_computes_the_same(tmp_path):
    cache = tmp_path / "cpu_linear.json"
    plain = small_llama()
    linears = [m for m in plain.modules() if isinstance(m, torch.nn.Linear)]
    key = cpu_linear.plan_key(linears)
    cache.write_text(json.dumps({key: {"2": "packed", "64": "packed", "3": "transposed"}}))
    model = small_llama()
    assert cpu_linear.install(model, cache) == {2: "packed", 64: "packed", 3: "transposed"}
    assert all(m.packed is not None for m in model.modules() if isinstance(m, cpu_linear.SmallBatchLinear))
    with torch.inference_mode():
        for rows in (1, 2, 3, 70):
            ids = torch.arange(rows).unsqueeze(0) % 128
            torch.testing.assert_close(model(input_ids=ids).logits, plain(input_ids=ids).logits,
                                       rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("text", ["{not json", '["a list"]', '{"KEY": {"2": "fastest"}}',
                                  '{"KEY": {"two": "packed"}}'])
def test_a_broken_cache_is_timed_again_and_rewritten(tmp_path, text):
    cache = tmp_path / "cpu_linear.json"
    model = small_llama()
    key = cpu_linear.plan_key([m for m in model.modules() if isinstance(m, torch.nn.Linear)])
    cache.write_text(text.replace("KEY", key))
    plan = cpu_linear.install(model, cache)
    assert json.loads(cache.read_text())[key] == {str(n): f for n, f in plan.items()}


def test_the_cache_file_is_the_cache_folders_unless_the_environment_says(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(cpu_linear.PLAN_CACHE_ENV, raising=False)
    assert cpu_linear.plan_cache() == tmp_path / "codespec-lsp" / "cpu_linear.json"
    monkeypatch.setenv(cpu_linear.PLAN_CACHE_ENV, "off")
    assert cpu_linear.plan_cache() is None
    monkeypatch.setenv(cpu_linear.PLAN_CACHE_ENV, str(tmp_path / "plans.json"))
    assert cpu_linear.plan_cache() == tmp_path / "plans.json"
    # a cache that cannot be written: the plan is still installed
    (tmp_path / "file").write_text("")
    assert isinstance(cpu_linear.install(small_llama(), tmp_path / "file" / "plans.json"), dict)
