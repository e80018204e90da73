"""The model's own conventions: a prompt starts with the model's document start (a chat model's
turn marker is not one), and every end token the vocabulary has stops a completion, in the
in-process engine and on a remote server (vLLM's stop_token_ids) alike."""

from __future__ import annotations

import pytest
import torch

from codespec_lsp import TINY_DIR
from codespec_lsp.engine.api import document_start_id, end_token_ids
from codespec_lsp.engine.models import load_model, load_tokenizer
from codespec_lsp.remote import connect_remote
from tests.engine_helpers import make_engine
from tests.fake_openai_server import FakeServer

pytestmark = pytest.mark.slow


def chatml_tokenizer():
    """The tiny tokenizer dressed as SmolLM2-Instruct's: BOS <|im_start|>, EOS <|im_end|>, and
    the pretraining document separator <|endoftext|>."""
    tok = load_tokenizer(str(TINY_DIR / "target"))
    tok.add_special_tokens({"bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
                            "additional_special_tokens": ["<|endoftext|>"]})
    return tok


def test_a_chat_models_prompt_starts_with_its_document_separator_and_every_end_stops():
    tok = chatml_tokenizer()
    vocab = tok.get_vocab()
    assert document_start_id(tok) == vocab["<|endoftext|>"] != tok.bos_token_id
    assert end_token_ids(tok) == {vocab["<|im_end|>"], vocab["<|endoftext|>"]}
    assert end_token_ids(tok, [7, 9]) >= {7, 9}
    plain = load_tokenizer(str(TINY_DIR / "target"))  # BOS <s>: a document start already
    assert document_start_id(plain) == plain.bos_token_id
    assert end_token_ids(plain) == {plain.eos_token_id}


def test_the_engine_encodes_and_stops_by_the_models_conventions():
    tok = chatml_tokenizer()
    target = load_model(str(TINY_DIR / "target"), device="cpu", dtype=torch.float32)
    engine = make_engine(target, None, tok)
    vocab = tok.get_vocab()
    assert engine.encode("x = 1")[0] == vocab["<|endoftext|>"]
    assert engine.fit(engine.encode("x = 1"), reserve=8)[0] == vocab["<|endoftext|>"]
    assert {vocab["<|im_end|>"], vocab["<|endoftext|>"]} <= engine.stop_ids


def test_a_remote_server_is_sent_every_end_id_and_the_same_document_start():
    tok = chatml_tokenizer()
    vocab = tok.get_vocab()
    with FakeServer() as fake:
        backend = connect_remote(fake.url, tokenizer=tok, notify=lambda *a: None,
                                 backoff_s=(0.0, 0.0))
        try:
            ids = backend.encode("x = 1")
            assert ids[0] == vocab["<|endoftext|>"]
            list(backend.generate(ids, max_new_tokens=2))
            body = fake.completions()[0]["body"]
            # ... and generation_config.json's eos beside the tokenizer (2 in the tiny folder)
            assert set(body["stop_token_ids"]) == {vocab["<|im_end|>"], vocab["<|endoftext|>"], 2}
        finally:
            backend.close()
