"""engine/hf.py's two CPU fixes under transformers: attention that reads grouped KV heads without
copying them, and a KV cache written in place; both compute what transformers' own do."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from codespec_lsp.engine import hf
from codespec_lsp.engine.models import TINY_DIR, load_model


def test_cpu_attention_reads_grouped_heads_without_copies_and_matches_eager(monkeypatch):
    model = load_model(str(TINY_DIR / "target"), device="cpu", dtype=torch.float32)
    assert model.config._attn_implementation == hf.CPU_ATTENTION
    groups = model.config.num_attention_heads // model.config.num_key_value_heads
    assert groups > 1  # the case the fast path is for
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(query, key, value, **kwargs):
        calls.append((query.shape[1], key.shape[1], kwargs.get("enable_gqa", False)))
        return sdpa(query, key, value, **kwargs)

    monkeypatch.setattr(hf.F, "scaled_dot_product_attention", spy)
    prompt, verify = list(range(40, 90)), [7, 300, 12, 5, 81]
    cache = hf.new_cache(model)
    hf.forward(model, prompt, cache)
    calls.clear()
    fast = hf.forward(model, verify, cache)  # several rows after a cached prefix: a masked forward
    # every layer's keys reach SDPA once per KV head, not repeated per query head
    assert calls and all(kv * groups == q and gqa for q, kv, gqa in calls)
    model.set_attn_implementation("eager")
    reference = hf.new_cache(model)
    hf.forward(model, prompt, reference)
    torch.testing.assert_close(fast, hf.forward(model, verify, reference), rtol=1e-4, atol=1e-4)


def test_the_cache_grows_in_place_and_holds_what_concatenation_would():
    model = load_model(str(TINY_DIR / "target"), device="cpu", dtype=torch.float32)
    ids = torch.randint(3, 500, (80,)).tolist()
    cache = hf.new_cache(model)
    assert all(type(layer) is hf.GrowingLayer for layer in cache.layers)
    hf.forward(model, ids[:60], cache)
    hf.forward(model, ids[60:61], cache)  # grows once: room for 90
    layer = cache.layers[0]
    buffer = layer.buffers[0].data_ptr()
    hf.crop(cache, 50)  # a rejected draft: the next forward overwrites what was cut
    logits = hf.forward(model, ids[50:80], cache)
    assert layer.buffers[0].data_ptr() == buffer  # written in place, no copy of the cache
    assert hf.cache_len(cache) == 80 and layer.buffers[0].shape[-2] == 90
    # the prefix cache's byte budget counts the room, not just the positions held
    assert hf.cache_nbytes(cache) == sum(2 * layer.buffers[0].numel() * 4 for layer in cache.layers)
    plain = DynamicCache(config=model.config)  # transformers' own, concatenating
    with torch.inference_mode():
        want = model(input_ids=torch.tensor([ids]), past_key_values=plain, use_cache=True).logits[0, 50:]
    torch.testing.assert_close(logits, want, rtol=1e-4, atol=1e-4)
    for mine, theirs in zip(cache.layers, plain.layers):
        torch.testing.assert_close(mine.keys, theirs.keys, rtol=1e-4, atol=1e-4)


def test_a_prefill_chunk_computes_the_last_rows_logits_only():
    model = load_model(str(TINY_DIR / "target"), device="cpu", dtype=torch.float32)
    ids = torch.randint(3, 500, (40,)).tolist()
    full, last = hf.new_cache(model), hf.new_cache(model)
    every = hf.forward(model, ids, full)
    one = hf.forward(model, ids, last, last_only=True)
    assert every.shape[0] == 40 and one.shape[0] == 1
    torch.testing.assert_close(one[0], every[-1], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(last.layers[0].keys, full.layers[0].keys)  # the same KV either way
