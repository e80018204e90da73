"""Regression tests for the engine review's bugs (issue 10), each failing on the old engine."""

from __future__ import annotations

import pytest

from engine_helpers import generate_text, make_engine, reference_greedy, tiny_parts, toy_pair

pytestmark = pytest.mark.slow


def test_every_end_token_stops_generation():
    """Bug 3: generation_config's eos list (and `<EOT>`) stops, not only tokenizer.eos_token_id."""
    tok, target, draft = toy_pair(8)
    engine = make_engine(target, None, tok)
    free = generate_text(engine, "w1 w2", max_new_tokens=12).tokens
    end = free[3]  # a token greedy decoding reaches: make it an end token of the model
    target.generation_config.eos_token_id = [99, end]
    for speculative in (False, True):
        engine = make_engine(target, draft, tok)
        assert end in engine.stop_ids
        result = generate_text(engine, "w1 w2", max_new_tokens=12, speculative=speculative)
        assert result.tokens == free[:free.index(end)] and result.stop_reason == "eos"
    target.generation_config.eos_token_id = None


def test_exception_mid_forward_leaves_a_usable_cache():
    """Bug 5: an error (not out-of-memory) inside a forward, between layers, must not leave a cache
    whose layers hold different lengths for the next request to reuse."""
    tok, target, draft = tiny_parts()  # several layers: the error lands after the first wrote KV
    engine = make_engine(target, draft, tok)
    prompt = "def add(a, b):\n    return"
    expected = reference_greedy(target, tok, engine, prompt, 10)
    layer = target.model.layers[-1]
    calls = {"n": 0}

    def boom(module, args):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("boom")

    handle = layer.register_forward_pre_hook(boom)
    try:
        with pytest.raises(RuntimeError, match="boom"):
            generate_text(engine, prompt, max_new_tokens=10)
    finally:
        handle.remove()
    again = generate_text(engine, prompt, max_new_tokens=10)
    assert again.tokens == expected


def test_engine_is_freed_and_its_hooks_removed():
    """Bug 6 (and 4's engine side): each Engine added forward hooks that held it and were never
    removed, so a model outliving its engine kept the old engine alive and ran its checks."""
    import gc
    import weakref

    tok, target, draft = toy_pair(8)
    layer = target.model.layers[0]
    before = len(layer._forward_pre_hooks)
    engine = make_engine(target, draft, tok)
    generate_text(engine, "w1 w2", max_new_tokens=3)
    ref = weakref.ref(engine)
    gc.disable()  # freed by reference counting: no cycle through the model's hooks
    try:
        del engine
        assert ref() is None
    finally:
        gc.enable()
    assert len(layer._forward_pre_hooks) == before


HEADER = "".join(f"# Copyright (c) 2026 Example Project contributors. Line {i} of the licence header.\n"
                 for i in range(30))


def test_two_documents_sharing_a_header_each_keep_their_cache():
    """Bug 1: the prefix cache handed one document's entry to another that shared its licence
    header, cropping it to the header: alternating keystrokes in two such files re-ran ~200
    tokens each time. One entry per document; a shared head is copied, never taken."""
    from engine_helpers import CORPUS
    tok, target, draft = tiny_parts()
    engine = make_engine(target, draft, tok)
    bodies = {"file:///a.py": HEADER + (CORPUS / "textwrap.py").read_text()[:1500],
              "file:///b.py": HEADER + (CORPUS / "shlex.py").read_text()[:1500]}
    first = {}
    for key, text in bodies.items():
        first[key] = generate_text(engine, text, max_new_tokens=2, key=key)
    # b's first request found a's header: a copy of it, not a cold start
    assert first["file:///b.py"].reused_tokens >= engine.count_tokens(HEADER) - 1
    for typed in "x = 1":
        for key in bodies:
            bodies[key] += typed
            result = generate_text(engine, bodies[key], max_new_tokens=2, key=key)
            assert result.prefill_tokens <= 8, (key, typed, result.prefill_tokens)
    assert len(engine.target_cache) == 2
    # a request never takes another document's entry: a's entry is still whole
    again = generate_text(engine, bodies["file:///a.py"], max_new_tokens=2, key="file:///a.py")
    assert again.prefill_tokens <= 2


def test_a_shared_head_is_copied_alone_not_the_donors_whole_cache(monkeypatch):
    """Issue 28, bug 5: a shared-header hit deep-copied the donor's whole cache, then cropped it.
    The copy now allocates only the head: every tensor made while copying is at most the head's
    length, the donor is untouched, and the copied KV equals the donor's head."""
    import copy

    import torch

    from codespec_lsp.engine.kvcache import KV
    tok, target, _ = tiny_parts()
    donor = KV(target)
    donor.extend(list(range(5, 205)))
    monkeypatch.setattr(copy, "deepcopy", lambda *a, **k: pytest.fail("deep-copied the donor"))
    head = donor.copy(30)
    assert len(head) == 30 and head.nbytes * 200 == donor.nbytes * 30
    assert len(donor) == 200 and donor.cache.get_seq_length() == 200
    for mine, theirs in zip(head.cache.layers, donor.cache.layers):
        assert mine.keys.shape[-2] == 30 and torch.equal(mine.keys, theirs.keys[..., :30, :])
        assert torch.equal(mine.values, theirs.values[..., :30, :])
        assert mine.keys.data_ptr() != theirs.keys.data_ptr()
    # the copy goes on like a KV of its own
    assert torch.allclose(head.extend([7])[-1], KV(target, ).extend(list(range(5, 35)) + [7])[-1], atol=1e-4)
