"""Shared builders for the engine tests: the embedded pair, odd drafts, a toy small-vocab pair."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from codespec_lsp.engine.engine import Engine
from codespec_lsp.engine.models import TINY_DIR, load_model, load_tokenizer

CORPUS = Path(__file__).resolve().parent.parent / "benchmarks" / "corpus"
# Prompts the engine tests generate after, and how many tokens: one short, one of a few lines,
# one well over 512 tokens (several prefill chunks).
SOURCE = (CORPUS / "textwrap.py").read_text()
PROMPTS = {"short": "def add(a, b):\n    ", "medium": SOURCE[:900], "long": SOURCE[:6000]}
N_NEW = 24


def tiny_parts():
    tok = load_tokenizer(str(TINY_DIR / "target"))
    target = load_model(str(TINY_DIR / "target"), device="cpu", dtype=torch.float32)
    draft = load_model(str(TINY_DIR / "draft"), device="cpu", dtype=torch.float32)
    return tok, target, draft


def random_draft_like(model, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(**{**model.config.to_dict(), "num_hidden_layers": 1})
    return LlamaForCausalLM(config).eval()


def make_engine(target, draft, tok, **kw) -> Engine:
    return Engine(target, draft, tok, preset="test", target_name="target", draft_name="draft",
                  device="cpu", **kw)


DRAFT_KINDS = ["target", "embedded", "identical", "random", "ngram"]


def engine_of_kind(kind: str, parts) -> Engine:
    """An engine over the embedded target drafting in one of DRAFT_KINDS: the target alone (run
    with speculative=False), the embedded draft, the target itself as draft (it proposes the
    target's unadjusted choices), a random 1-layer draft, or n-gram lookup."""
    tok, target, draft = parts
    draft_model, drafter = {"target": (None, "ngram"), "embedded": (draft, "model"),
                            "identical": (target, "model"), "random": (random_draft_like(target), "model"),
                            "ngram": (None, "ngram")}[kind]
    return make_engine(target, draft_model, tok, drafter=drafter)


def pearson_chi_square(counts, exact: dict, trials: int) -> float:
    """Pearson's chi-square of sampled `counts` against `exact` probabilities per outcome, the
    outcomes expected fewer than 5 times pooled into one cell."""
    big = [k for k in exact if exact[k] * trials >= 5]
    pooled_p = 1 - sum(exact[k] for k in big)
    pooled_n = trials - sum(counts[k] for k in big)
    chi2 = sum((counts[k] - trials * exact[k]) ** 2 / (trials * exact[k]) for k in big)
    if pooled_p * trials >= 1:
        chi2 += (pooled_n - trials * pooled_p) ** 2 / (trials * pooled_p)
    return chi2


def sampled_pairs_chi_square(engine: Engine, prompt: str, exact: dict, trials: int = 3000,
                             temperature: float = 1.0, **options) -> float:
    """pearson_chi_square of `trials` seeded two-token samples (temperature 1 unless told)
    against `exact`, the probability of each pair of ids."""
    counts = Counter(tuple(generate_text(engine, prompt, max_new_tokens=2, temperature=temperature,
                                         seed=s, **options).tokens) for s in range(trials))
    assert sum(counts.values()) == trials and all(len(k) == 2 for k in counts)
    return pearson_chi_square(counts, exact, trials)


def reference_greedy(target, tok, engine: Engine, prompt: str, n: int) -> list[int]:
    """What transformers' own generate gives for the target alone."""
    ids = engine.encode_prompt(prompt, reserve=n + 9)
    out = target.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False,
                          pad_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id)
    new = out[0, len(ids):].tolist()
    return new[:new.index(tok.eos_token_id)] if tok.eos_token_id in new else new


def toy_pair(vocab: int = 8, seed: int = 0):
    """A target and a different draft over a word-level vocabulary of `vocab` symbols, so output
    distributions can be enumerated exactly."""
    words = {f"w{i}": i for i in range(vocab)}
    backend = Tokenizer(models.WordLevel(vocab=words, unk_token="w0"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="w0")

    def model(s: int) -> LlamaForCausalLM:
        torch.manual_seed(s)
        cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                          bos_token_id=None, eos_token_id=None, pad_token_id=None)
        m = LlamaForCausalLM(cfg).eval()
        with torch.no_grad():  # sharpen the random logits so p and q really differ
            m.lm_head.weight.mul_(8.0)
        return m

    return tok, model(seed), model(seed + 1)


def generate_text(engine: Engine, prompt: str, *, stop=(), stop_fn=None, **options):
    """Text in, result out (with `.text`), through the same path complete.py takes."""
    from codespec_lsp.completion.complete import run
    ids = engine.encode(prompt)
    return run(engine.generate(ids, **options), engine.tokenizer, ids, stop=stop, stop_fn=stop_fn)


def prefill_text(engine: Engine, prompt: str, **options):
    return engine.prefill(engine.encode(prompt), **options)
