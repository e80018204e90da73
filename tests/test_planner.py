"""planner: parameter counts, weight bytes, KV bytes, context fit and the speedup model."""

import json

import pytest

from codespec_lsp.planning import planner as P
from codespec_lsp.planning.doctor import load_catalog

CATALOG = load_catalog()


def shape_quant(hub_id):
    cfg = CATALOG[hub_id]["config"]
    return P.shape_from_config(cfg), P.quant_from_config(cfg)


@pytest.mark.parametrize("hub_id", ["codellama/CodeLlama-7b-hf", "codellama/CodeLlama-34b-Python-hf",
                                    "RedHatAI/Mistral-7B-Instruct-v0.3-GPTQ-4bit",
                                    "RedHatAI/granite-3.1-8b-instruct-quantized.w8a8"])
def test_param_count_matches_the_model_transformers_builds(hub_id):
    torch = pytest.importorskip("torch")
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = {k: v for k, v in CATALOG[hub_id]["config"].items()
           if k not in ("quantization_config", "architectures", "torch_dtype")}
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    with torch.device("meta"):  # shapes only: no memory, no init
        model = AutoModelForCausalLM.from_config(config)
    assert P.param_count(P.shape_from_config(CATALOG[hub_id]["config"])) == sum(
        p.numel() for p in model.parameters())


def test_gptq_linear_bytes_by_hand():
    q = P.Quant("gptq", bits=4, group_size=128, zeros=True, g_idx=True)
    # 4096x4096 at 4 bits: packed weights, 32 groups of fp16 scales and int32-packed zeros, int32 g_idx.
    qweight, scales, qzeros, g_idx = 4096 * 4096 // 2, 32 * 4096 * 2, 32 * (4096 // 8) * 4, 4096 * 4
    assert P.linear_bytes(4096, 4096, q) == qweight + scales + qzeros + g_idx == 8_732_672
    assert P.linear_bytes(4096, 4096, P.Quant("none")) == 4096 * 4096 * 2
    w8 = P.Quant("compressed-tensors", bits=8)  # int8 weights, one fp16 scale per output channel
    assert P.linear_bytes(4096, 12800, w8) == 4096 * 12800 + 12800 * 2


@pytest.mark.parametrize("hub_id", [k for k, e in CATALOG.items() if "published_weights_bytes" in e])
def test_weight_bytes_match_the_published_checkpoint_sizes(hub_id):
    """The strongest check of the byte formulas: the real safetensors files on the hub."""
    entry = CATALOG[hub_id]
    s, q = shape_quant(hub_id)
    planned = P.weight_bytes(s, q)
    if entry.get("published_weights_include_untied_lm_head"):
        planned += s.vocab * s.hidden * 2  # on disk only: transformers ties it back on load
    assert planned == pytest.approx(entry["published_weights_bytes"], rel=0.005)


def test_kv_bytes_per_token_from_published_shapes():
    s, _ = shape_quant("codellama/CodeLlama-13b-Python-hf")
    assert P.kv_bytes_per_token(s) == 40 * 40 * 128 * 2 * 2
    s, _ = shape_quant("codellama/CodeLlama-34b-Python-hf")  # grouped-query: 8 KV heads of 64
    assert P.kv_bytes_per_token(s) == 48 * 8 * 128 * 2 * 2


def test_untied_embedding_table_is_not_streamed():
    s, q = shape_quant("codellama/CodeLlama-7b-Python-hf")
    assert P.weight_bytes(s, q) - P.streamed_weight_bytes(s, q) == 32000 * 4096 * 2
    g, gq = shape_quant("RedHatAI/granite-3.1-8b-instruct-quantized.w8a8")
    assert P.weight_bytes(g, gq) == P.streamed_weight_bytes(g, gq)  # tied: lm_head reads the table


def test_expected_tokens():
    assert P.expected_tokens(1.0, 4) == 5.0
    assert P.expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    assert P.expected_tokens(0.0, 5) == 1.0
    assert P.expected_tokens(1 - 1e-9, 3) == pytest.approx(4.0, rel=1e-6)  # continuous at α = 1


def test_best_k_is_the_argmax_and_zero_when_drafting_cannot_pay():
    for alpha, c in [(0.8, 0.05), (0.6, 0.2), (0.95, 0.5), (0.3, 0.3)]:
        k, s = P.best_k(alpha, c)
        assert s == max(P.expected_speedup(alpha, j, c) for j in range(P.K_MAX + 1))
        assert s == pytest.approx(P.expected_speedup(alpha, k, c))
    assert P.best_k(0.0, 0.1) == (0, 1.0)
    assert P.best_k(0.9, 1.0) == (0, 1.0)
    assert P.best_k(1.0, 0.01, k_max=8)[0] == 8  # perfect cheap draft: propose as much as allowed
    ks = [P.best_k(0.8, c)[0] for c in (0.01, 0.05, 0.1, 0.3, 0.6)]
    assert ks == sorted(ks, reverse=True) and ks[0] > ks[-1]  # dearer drafts, shorter proposals


def test_parse_size():
    assert P.parse_size("24GiB") == 24 * 2**30
    assert P.parse_size("24 GB") == 24 * 10**9
    assert P.parse_size("80G") == 80 * 2**30
    assert P.parse_size("1.5GiB") == 3 * 2**29
    assert P.parse_size("25769803776") == 24 * 2**30
    with pytest.raises(ValueError):
        P.parse_size("24 bananas")


def test_max_context_is_capped_by_positions_and_zero_when_weights_overflow():
    assert P.max_context(10_000, weights=2_000, kv_per_token=10, overhead=1_000) == 700
    assert P.max_context(10_000, weights=2_000, kv_per_token=10, overhead=1_000, max_positions=512) == 512
    assert P.max_context(10_000, weights=20_000, kv_per_token=10, overhead=1_000) == 0


def test_plan_json_has_exactly_the_contract_fields():
    d = CATALOG["TheBloke/CodeLlama-7B-Python-GPTQ"]["config"]
    t = CATALOG["TheBloke/CodeLlama-13B-Python-GPTQ"]["config"]
    out = P.plan(d, t, 24 * 2**30, 4096).to_json_dict()
    assert tuple(out) == P.JSON_FIELDS
    json.dumps(out)  # plain JSON types only


def test_plan_does_not_fit_when_weights_overflow_and_says_what_to_do():
    d = CATALOG["codellama/CodeLlama-13b-Python-hf"]["config"]
    t = CATALOG["codellama/CodeLlama-34b-Python-hf"]["config"]
    p = P.plan(d, t, 24 * 2**30, 4096)
    assert not p.fits and p.max_context == 0
    assert "does not fit" in p.verdict and "smaller quantization" in p.advice
