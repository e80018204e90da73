"""Loading: the embedded pair loads like any HF folder; bad pairs and bad folders are refused
with messages that say what to do."""

from __future__ import annotations

import json
import shutil
import time

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from codespec_lsp.engine import (MissingExtraError, ModelLoadError, TokenizerMismatchError,
                                 load_engine)
from codespec_lsp import TINY_DIR
from codespec_lsp.config import Settings, default_context_tokens
from codespec_lsp.engine.models import check_pair, load_tokenizer

pytestmark = pytest.mark.slow


def test_embedded_pair_is_plain_hf_and_small():
    total = sum(f.stat().st_size for f in TINY_DIR.rglob("*") if f.is_file())
    assert total <= 25 * 2**20
    target = AutoModelForCausalLM.from_pretrained(TINY_DIR / "target")
    draft = AutoModelForCausalLM.from_pretrained(TINY_DIR / "draft")
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(draft) * 3 < count(target)  # "much smaller", same family
    assert draft.config.model_type == target.config.model_type
    assert draft.config.vocab_size == target.config.vocab_size
    check_pair(load_tokenizer(str(TINY_DIR / "draft")), load_tokenizer(str(TINY_DIR / "target")),
               "draft", "target")


def test_embedded_pair_was_trained_on_windows_as_long_as_its_prompts():
    # A model run past the positions it was trained on writes noise there (the first embedded
    # target, trained on 512-token windows, fell from 0.22 to 0.17 accuracy at 1,536); the
    # server's default prefix budget must stay inside what the last phases trained.
    record = json.loads((TINY_DIR / "TRAINING.json").read_text())
    config = json.loads((TINY_DIR / "target" / "config.json").read_text())
    budget = default_context_tokens(config["max_position_embeddings"], Settings().max_tokens)
    last = record["phases"][-1]
    assert last["target_steps"] > 0 and last["draft_steps"] > 0
    assert last["seq"] >= budget + Settings().max_tokens


def _other_tokenizer(folder):
    """A byte-level BPE trained on different text: same kind, different ids."""
    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    backend.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 50, trainer=trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>",
                                  eos_token="</s>")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (folder / name).unlink(missing_ok=True)
    tok.save_pretrained(folder)


def test_mismatched_tokenizer_pair_is_refused(tmp_path):
    draft = tmp_path / "foreign-draft"
    shutil.copytree(TINY_DIR / "draft", draft)
    _other_tokenizer(draft)
    with pytest.raises(TokenizerMismatchError) as err:
        load_engine(preset="tiny", draft=str(draft), device="cpu")
    message = str(err.value)
    assert "tokeniz" in message and "same family" in message and str(draft) in message


def test_broken_model_folders_give_clear_errors(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_engine(preset="tiny", target=str(empty), draft="none", device="cpu")

    garbage = tmp_path / "garbage"
    shutil.copytree(TINY_DIR / "target", garbage)
    (garbage / "model.safetensors").write_bytes(b"\x00not a safetensors file" * 10)
    with pytest.raises(ModelLoadError, match="garbage"):
        load_engine(preset="tiny", target=str(garbage), draft="none", device="cpu")

    bad_json = tmp_path / "bad-json"
    shutil.copytree(TINY_DIR / "target", bad_json)
    (bad_json / "config.json").write_text("{ not json")
    with pytest.raises(ModelLoadError, match="not valid JSON"):
        load_engine(preset="tiny", target=str(bad_json), draft="none", device="cpu")


def test_missing_hub_checkpoint_offline_fails_fast(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # an empty cache
    start = time.monotonic()
    with pytest.raises(ModelLoadError, match="downloads\\s+are off"):
        load_engine(preset="codellama-python", device="cpu")
    assert time.monotonic() - start < 30  # an error, not a hang on the network


def test_gptq_without_the_extra_names_the_extra(tmp_path):
    pytest.importorskip("torch")
    import importlib.util
    if importlib.util.find_spec("gptqmodel") and importlib.util.find_spec("optimum"):
        pytest.skip("the gptq extra is installed here")
    with pytest.raises(MissingExtraError, match=r"codespec-lsp\[gptq\]"):
        load_engine(preset="codellama-python-gptq", device="cpu")
    quantized = tmp_path / "gptq-folder"
    shutil.copytree(TINY_DIR / "target", quantized)
    config = json.loads((quantized / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 128}
    (quantized / "config.json").write_text(json.dumps(config))
    with pytest.raises(MissingExtraError, match="gptq"):
        load_engine(preset="tiny", target=str(quantized), draft="none", device="cpu")


def test_unknown_preset_and_dtype():
    with pytest.raises(ModelLoadError, match="unknown preset"):
        load_engine(preset="nope")
    with pytest.raises(ModelLoadError, match="unknown dtype"):
        load_engine(preset="tiny", dtype="float8", device="cpu")


def test_loading_a_model_turns_cudnn_attention_off():
    """cuDNN attention plans per sequence length (~55 ms each on an H200): a decoder, whose length
    grows every forward, must run on the flash or memory-efficient kernels instead."""
    import torch
    from codespec_lsp.engine.models import load_model
    was = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(True)
    try:
        load_model(str(TINY_DIR / "draft"), device="cpu", dtype=torch.float32)
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(was)
