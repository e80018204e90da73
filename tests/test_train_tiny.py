"""scripts/train_tiny.py's training step, in both precisions: it learns, and bf16 autocast leaves
the weights (what is saved) in fp32."""

from __future__ import annotations

import importlib.util
import pathlib
import random

import pytest
import torch
import torch.nn.functional as F
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _train_tiny():
    spec = importlib.util.spec_from_file_location("train_tiny", ROOT / "scripts" / "train_tiny.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


STREAM = torch.tensor([3, 5, 7, 11, 13, 17, 19, 23] * 64)


def _toy_model(layers: int) -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        bos_token_id=1, eos_token_id=2))


def _loss(model, x) -> float:
    with torch.no_grad():
        logits = model(x[:, :-1]).logits
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1)).item()


@pytest.mark.parametrize("bf16", [False, True])
def test_a_training_run_learns_a_repeating_stream(bf16):
    train_tiny = _train_tiny()
    model = _toy_model(layers=2)
    data = train_tiny.batches(STREAM, 1, 4, random.Random(0), seq=32)
    probe = next(train_tiny.batches(STREAM, 1, 4, random.Random(1), seq=32))
    before = _loss(model, probe)
    train_tiny.train(model, data, steps=40, peak_lr=1e-2, warmup=4, bf16=bf16)
    assert _loss(model, probe) < 0.3 * before
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_a_wider_target_keeps_the_shipped_proportions():
    train_tiny = _train_tiny()
    assert train_tiny.target_shape(256, 6) == train_tiny.TARGET
    wide = train_tiny.target_shape(384, 8)
    assert (wide["intermediate_size"], wide["num_attention_heads"], wide["num_key_value_heads"]) == (1152, 12, 6)
    with pytest.raises(SystemExit):
        train_tiny.target_shape(100, 4)


def test_training_files_come_from_the_given_stdlib_minus_tests_and_held_out(tmp_path):
    train_tiny = _train_tiny()
    held_out = next(train_tiny.HELD_OUT.glob("*.py")).name
    for rel in ("json/decoder.py", "test/test_json.py", "lib2to3/pytree.py", held_out, "shlex2.py",
                "idlelib/idle_test/test_x.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x = 1\n")
    names = {p.relative_to(tmp_path).as_posix() for p in train_tiny.training_files(tmp_path)}
    assert names == {"json/decoder.py", "shlex2.py"}


def test_a_timed_run_stops_on_its_clock_with_the_schedule_run_out(monkeypatch):
    """--target-minutes on a machine of unknown speed: the run ends when its time is up, and the
    cosine has followed the clock to its end rather than stopping half-way at a high LR."""
    import time
    train_tiny = _train_tiny()
    model = _toy_model(layers=1)
    data = train_tiny.batches(STREAM, 1, 2, random.Random(0), seq=16)
    shares, lr_at = [], train_tiny.lr_at
    monkeypatch.setattr(train_tiny, "lr_at", lambda *a: (shares.append(a[-1]), lr_at(*a))[1])
    started = time.time()
    steps = train_tiny.train(model, data, steps=20_000, peak_lr=1e-2, warmup=2, minutes=0.03)
    assert time.time() - started < 0.03 * 60 + 5
    assert 3 < steps < 20_000 and len(shares) == steps
    after_warmup = shares[2:]
    assert after_warmup == sorted(after_warmup) and after_warmup[-1] > 0.8
    assert lr_at(steps, 10**6, 1.0, 2, done=1.0) == pytest.approx(0.02)


def test_growing_a_trained_target_keeps_its_function_and_its_cache(tmp_path):
    train_tiny = _train_tiny()
    model = _toy_model(layers=2)
    train_tiny.train(model, train_tiny.batches(STREAM, 1, 4, random.Random(0), seq=32),
                     steps=10, peak_lr=1e-2, warmup=2)
    x = next(train_tiny.batches(STREAM, 1, 2, random.Random(1), seq=24))
    with torch.no_grad():
        before = model(x).logits
    train_tiny.grow_depth(model, 5)
    assert len(model.model.layers) == model.config.num_hidden_layers == 5
    assert [layer.self_attn.layer_idx for layer in model.model.layers] == list(range(5))
    with torch.no_grad():
        assert torch.allclose(model(x).logits, before, atol=1e-5)
        # token by token through the KV cache: each layer must write its own cache slot
        cache = DynamicCache(config=model.config)
        stepped = torch.cat([model(x[:, i:i + 1], past_key_values=cache, use_cache=True).logits
                             for i in range(x.size(1))], dim=1)
    assert torch.allclose(stepped, before, atol=1e-4)
    # the new layers learn (their zeroed outputs move) and the grown model saves and reloads
    train_tiny.train(model, train_tiny.batches(STREAM, 1, 4, random.Random(2), seq=32),
                     steps=5, peak_lr=1e-2, warmup=1)
    assert model.model.layers[1].mlp.down_proj.weight.abs().sum() > 0
    model.save_pretrained(tmp_path)
    again = LlamaForCausalLM.from_pretrained(tmp_path)
    with torch.no_grad():
        assert torch.allclose(again(x).logits, model(x).logits, atol=1e-5)
    with pytest.raises(SystemExit):
        train_tiny.grow_depth(model, 5)


def _loss_after(model, x, marker: int) -> float:
    """Mean cross-entropy of the tokens that follow `marker`."""
    with torch.no_grad():
        logits = model(x[:, :-1]).logits
    each = F.cross_entropy(logits.reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1), reduction="none")
    return each[(x[:, :-1] == marker).reshape(-1)].mean().item()


def test_line_start_weight_spends_the_training_on_the_token_after_indentation():
    """--line-start-weight: the token after a newline-and-indentation id weighs more, so the same
    steps on the same windows learn it faster than an unweighted run does."""
    train_tiny = _train_tiny()
    rng = random.Random(0)
    stream = torch.tensor([t for _ in range(200) for t in (3, rng.choice([5, 7]), 11, rng.choice([13, 17, 19]))])
    line_starts = torch.zeros(32, dtype=torch.bool)
    line_starts[11] = True  # 11 plays "\n    ": the token after it, 13/17/19, starts the line
    probe = next(train_tiny.batches(stream, 1, 8, random.Random(1), seq=32))
    after = {}
    for weight in (1.0, 8.0):
        model = _toy_model(layers=1)
        data = train_tiny.batches(stream, 1, 4, random.Random(0), seq=32)
        train_tiny.train(model, data, steps=12, peak_lr=3e-3, warmup=2, line_starts=line_starts,
                         line_start_weight=weight)
        after[weight] = _loss_after(model, probe, 11)
    assert after[8.0] < after[1.0] - 0.05


def test_line_start_ids_are_the_ids_ending_in_a_newline_and_indentation():
    from transformers import PreTrainedTokenizerFast
    from codespec_lsp import TINY_DIR
    tok = PreTrainedTokenizerFast.from_pretrained(TINY_DIR / "target")
    marked = _train_tiny().line_start_ids(tok)
    texts = {t: marked[tok.convert_tokens_to_ids(tok.tokenize(t))[0]].item() for t in ("\n    ", "\n", " if", "):")}
    assert texts == {"\n    ": True, "\n": True, " if": False, "):": False}
