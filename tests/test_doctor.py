"""doctor: the verdicts users get for the pairs they actually pick, and the CLI's JSON contract."""

import json
import re
import shutil

import pytest

from codespec_lsp import TINY_DIR
from codespec_lsp.planning import doctor
from codespec_lsp.cli import main
from codespec_lsp.planning.planner import DEFAULT_ACCEPTANCE, JSON_FIELDS, RUNTIME_OVERHEAD_BYTES

GiB = 2**30
MISTRAL, GRANITE = "RedHatAI/Mistral-7B-Instruct-v0.3-GPTQ-4bit", "RedHatAI/granite-3.1-8b-instruct-quantized.w8a8"
CL7, CL13 = "TheBloke/CodeLlama-7B-Python-GPTQ", "TheBloke/CodeLlama-13B-Python-GPTQ"


def e_tokens(a, k):
    return k + 1 if a == 1 else (1 - a ** (k + 1)) / (1 - a)


def test_mistral_draft_granite_target_is_refused_and_would_not_pay_anyway():
    p = doctor.plan_pair(MISTRAL, GRANITE, 24 * GiB, 4096)
    assert p["tokenizer_compatible"] is False
    assert "incompatible tokenizers" in p["verdict"]
    for why in ("mistral vs granite", "LlamaTokenizer vs GPT2Tokenizer", "32768 vs 49155"):
        assert why in p["verdict"]
    assert (p["best_k"], p["expected_speedup"], p["acceptance_rate"]) == (0, 1.0, 0.0)
    # 4-bit 7B against 8-bit 8B: half the bytes per forward.
    assert p["cost_ratio"] == pytest.approx(0.5, abs=0.05)
    m = re.search(r"Even if the tokenizers matched.*best is ([0-9.]+)x \(K=(\d+)\): little speedup", p["advice"])
    assert m, p["advice"]
    best, k = float(m.group(1)), int(m.group(2))
    c = p["cost_ratio"]
    by_k = [e_tokens(DEFAULT_ACCEPTANCE, j) / (1 + j * c) for j in range(9)]
    assert best == pytest.approx(max(by_k), abs=0.005) and k == by_k.index(max(by_k))
    assert best < 1.3


def test_codellama_7b_13b_gptq_on_24gib_by_hand():
    assert RUNTIME_OVERHEAD_BYTES == 3 * GiB // 2  # the stated overhead: CUDA context 0.5 + activations 1.0

    def gptq4(i, o):  # qweight (4 bits) + fp16 scales + int32-packed zeros per 128-row group + g_idx
        return i * o // 2 + (i // 128) * o * 2 + (i // 128) * (o // 8) * 4 + i * 4

    # CodeLlama-7B: hidden 4096, intermediate 11008, 32 layers, 32 heads of 128, vocab 32000, untied.
    layer7 = 4 * gptq4(4096, 4096) + 2 * gptq4(4096, 11008) + gptq4(11008, 4096) + 2 * 4096 * 2
    w7 = 32 * layer7 + 2 * 32000 * 4096 * 2 + 4096 * 2           # = 3,893,862,400 (file: 3.90 GB)
    # CodeLlama-13B: hidden 5120, intermediate 13824, 40 layers, 40 heads of 128.
    layer13 = 4 * gptq4(5120, 5120) + 2 * gptq4(5120, 13824) + gptq4(13824, 5120) + 2 * 5120 * 2
    w13 = 40 * layer13 + 2 * 32000 * 5120 * 2 + 5120 * 2         # = 7,255,009,280 (file: 7.26 GB)
    kv7, kv13 = 32 * 32 * 128 * 2 * 2, 40 * 40 * 128 * 2 * 2      # 524,288 and 819,200 bytes/token
    free = 24 * GiB - 3 * GiB // 2 - w7 - w13                     # 13,010,319,360 bytes for KV
    max_ctx = free // (kv7 + kv13)                                # 9683 tokens
    assert (w7, w13, max_ctx) == (3_893_862_400, 7_255_009_280, 9683)

    # Bytes read per forward at 4096 tokens: weights minus the untied embedding table (one row
    # gathered), plus the whole KV cache.
    c = (w7 - 32000 * 4096 * 2 + kv7 * 4096) / (w13 - 32000 * 5120 * 2 + kv13 * 4096)  # 0.5620
    for alpha, want_k in ((0.8, 1), (0.9, 3)):
        speedups = [e_tokens(alpha, k) / (1 + k * c) for k in range(9)]
        best = max(speedups)
        assert speedups.index(best) == want_k
        p = doctor.plan_pair(CL7, CL13, 24 * GiB, 4096, acceptance=alpha)
        assert p["tokenizer_compatible"] is True and p["fits"] is True
        assert p["max_context"] == max_ctx
        assert p["draft_kv_bytes_per_token"] == kv7 and p["target_kv_bytes_per_token"] == kv13
        assert p["draft_weights_gib"] == pytest.approx(w7 / GiB, abs=1e-3)
        assert p["cost_ratio"] == pytest.approx(c, abs=1e-4)
        assert p["acceptance_source"] == "given" and p["acceptance_rate"] == alpha
        assert p["best_k"] == want_k
        assert p["expected_tokens_per_target_forward"] == pytest.approx(e_tokens(alpha, want_k), abs=1e-4)
        assert p["expected_speedup"] == pytest.approx(best, abs=1e-4)
    assert "smaller draft" in p["advice"] and "n-gram" in p["advice"]  # c ≈ 0.56 is too dear


def test_fixed_k_is_reported_and_best_k_still_named():
    p = doctor.plan_pair(CL7, CL13, 24 * GiB, 4096, k=4, acceptance=0.8)
    assert p["best_k"] == 1
    assert p["expected_tokens_per_target_forward"] == pytest.approx(e_tokens(0.8, 4), abs=1e-4)
    assert "K=4 gives" in p["advice"]


def test_codellama_base_and_python_do_not_pair():
    """CodeLlama base adds 16 infill ids to the Python vocabulary: the target's <PRE>/<SUF>/<MID>
    ids would reach a draft with no embedding for them, so the loader refuses the pair, and the
    doctor says the same."""
    check = doctor.check_tokenizers(doctor.resolve("codellama/CodeLlama-7b-Python-hf", "draft"),
                                    doctor.resolve("codellama/CodeLlama-13b-hf", "target"))
    assert not check.compatible and "vocabulary sizes differ (32000 vs 32016)" in check.reason
    same = doctor.check_tokenizers(doctor.resolve("codellama/CodeLlama-7b-hf", "draft"),
                                   doctor.resolve("codellama/CodeLlama-13b-hf", "target"))
    assert same.compatible and "32016 ids" in same.reason
    gptq = doctor.check_tokenizers(doctor.resolve(CL7, "draft"), doctor.resolve(CL13, "target"))
    assert gptq.compatible  # CodeLlamaTokenizer vs LlamaTokenizer: same vocabulary, name only


def test_cli_json_prints_exactly_the_fields(capsys):
    assert main(["doctor", "--draft", CL7, "--target", CL13, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out) == list(JSON_FIELDS) == [
        "tokenizer_compatible", "draft_params", "target_params", "draft_weights_gib",
        "target_weights_gib", "draft_kv_bytes_per_token", "target_kv_bytes_per_token", "max_context",
        "fits", "cost_ratio", "acceptance_rate", "acceptance_source", "best_k",
        "expected_tokens_per_target_forward", "expected_speedup", "verdict", "advice"]
    assert out["acceptance_source"] == "assumed" and out["acceptance_rate"] == DEFAULT_ACCEPTANCE


def test_cli_text_report_and_bad_input(capsys):
    assert main(["doctor", "--draft", MISTRAL, "--target", GRANITE, "--gpu-mem", "16GB"]) == 0
    text = capsys.readouterr().out
    assert "INCOMPATIBLE" in text and "verdict" in text and "advice" in text
    assert main(["doctor", "--draft", "no/such-model", "--target", CL13]) == 2
    assert "catalog knows" in capsys.readouterr().err
    assert main(["doctor", "--draft", CL7, "--target", CL13, "--gpu-mem", "lots"]) == 2


@pytest.fixture
def tokenizer_folders(tmp_path):
    """Two copies of the tiny tokenizer; in the second, the ids of 'a' and 'e' are swapped."""
    src = TINY_DIR / "draft"
    folders = []
    for name in ("same", "swapped"):
        d = tmp_path / name
        d.mkdir()
        for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
            shutil.copy(src / f, d / f)
        folders.append(d)
    tj = json.loads((folders[1] / "tokenizer.json").read_text())
    vocab = tj["model"]["vocab"]
    vocab["a"], vocab["e"] = vocab["e"], vocab["a"]
    (folders[1] / "tokenizer.json").write_text(json.dumps(tj))
    return folders, min(vocab["a"], vocab["e"])


def test_local_tokenizers_compared_token_by_token(tokenizer_folders):
    (same, swapped), first_id = tokenizer_folders
    draft = doctor.resolve(str(TINY_DIR / "draft"), "draft")
    ok = doctor.check_tokenizers(draft, doctor.resolve(str(same), "target"))
    assert ok.compatible and "100.00%" in ok.details[0]
    bad = doctor.check_tokenizers(draft, doctor.resolve(str(swapped), "target"))
    assert not bad.compatible
    assert "99.95% of the vocabulary agrees (4094 of 4096" in bad.reason
    assert "tokenize differently" in bad.reason
    assert re.search(rf"first differing: '[ae]' {first_id}->", bad.reason)


def _tokenizer_copy(folder, swap=()):
    """The tiny draft's tokenizer files in `folder`, with the ids of the tokens in `swap` exchanged."""
    folder.mkdir()
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TINY_DIR / "draft" / f, folder / f)
    if swap:
        tj = json.loads((folder / "tokenizer.json").read_text())
        vocab, (a, b) = tj["model"]["vocab"], swap
        vocab[a], vocab[b] = vocab[b], vocab[a]
        (folder / "tokenizer.json").write_text(json.dumps(tj))
    return folder


def test_doctor_and_loader_apply_one_rule(tmp_path):
    """Bug 7: two rare tokens swapped (99.95 % of the vocabulary agrees, every sample text still
    tokenizes the same) passed the doctor's 99 % threshold and was then refused by the loader.
    Now both apply codespec_lsp.engine.pairing: the doctor reports what the loader refuses, same reason."""
    from codespec_lsp.engine import TokenizerMismatchError, load_engine
    from codespec_lsp.engine.pairing import SAMPLE_TEXTS

    tok = doctor._load_tokenizer(TINY_DIR / "draft")
    used = {i for text in SAMPLE_TEXTS for i in tok.encode(text, add_special_tokens=False)}
    specials = set(tok.all_special_ids)
    rare = [t for t, i in sorted(tok.get_vocab().items(), key=lambda kv: -kv[1])
            if i not in used and i not in specials][:2]
    folder = _tokenizer_copy(tmp_path / "rare-swapped", swap=rare)

    check = doctor.check_tokenizers(doctor.resolve("tiny", "draft"), doctor.resolve(str(folder), "target"))
    assert not check.compatible
    assert "99.95% of the vocabulary agrees (4094 of 4096 tokens)" in check.reason
    assert "sample texts tokenize identically" in check.details  # the samples alone miss it
    p = doctor.plan_pair("tiny", str(folder), 24 * GiB, 1024)
    assert p["tokenizer_compatible"] is False and check.reason in p["verdict"]

    # The loader (draft = the swapped copy, target = the tiny target) refuses with the same reason.
    swapped_draft = _tokenizer_copy(tmp_path / "draft", swap=rare)
    back = doctor.check_tokenizers(doctor.resolve(str(swapped_draft), "draft"), doctor.resolve("tiny", "target"))
    with pytest.raises(TokenizerMismatchError) as err:
        load_engine(preset="tiny", draft=str(swapped_draft), device="cpu")
    assert back.reason in str(err.value) and "same family" in str(err.value)

    # And an identical copy passes both.
    same = _tokenizer_copy(tmp_path / "same")
    assert doctor.check_tokenizers(doctor.resolve(str(same), "draft"), doctor.resolve("tiny", "target")).compatible


def test_local_quantize_config_is_folded_in(tmp_path):
    shutil.copy(TINY_DIR / "target" / "config.json", tmp_path / "config.json")
    (tmp_path / "quantize_config.json").write_text(json.dumps({"bits": 4, "group_size": 128, "desc_act": False}))
    cfg = doctor.resolve(str(tmp_path), "target").config
    assert cfg["quantization_config"] == {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False}


def test_measured_numbers_replace_the_estimates(monkeypatch):
    seen = []

    def fake_measure(engine):
        seen.append(engine)
        return {"acceptance_rate": 0.65, "cost_ratio": 0.12, "draft_forward_ms": 1.2, "target_forward_ms": 10.0}, ""

    monkeypatch.setattr(doctor, "measure", fake_measure)
    engine = object()
    p = doctor.plan_pair(CL7, CL13, 24 * GiB, 4096, acceptance=0.9, engine=engine)
    assert seen == [engine]
    assert (p["acceptance_source"], p["acceptance_rate"], p["cost_ratio"]) == ("measured", 0.65, 0.12)
    speedups = [e_tokens(0.65, k) / (1 + k * 0.12) for k in range(9)]
    assert p["best_k"] == speedups.index(max(speedups))


@pytest.mark.slow
def test_tiny_pair_measured_with_the_engine(capsys):
    assert main(["doctor", "--draft", "tiny", "--target", "tiny", "--context", "1024", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tokenizer_compatible"] is True and out["fits"] is True
    assert out["acceptance_source"] == "measured", "both tiny models load locally, so α is measured"
    assert 0.0 <= out["acceptance_rate"] <= 1.0 and out["cost_ratio"] > 0
    assert out["max_context"] == 2048  # the tiny models' max_position_embeddings


def test_a_cost_ratio_measured_on_the_card_replaces_the_bytes_estimate(capsys):
    """c from scripts/gpu_bench.py (0.91 for fp16 7B/13B on an H200, against 0.52 by bytes read):
    the plan uses it, says where it came from, and explains why it exceeds the bytes figure."""
    args = ["doctor", "--draft", "codellama/CodeLlama-7b-Python-hf", "--target",
            "codellama/CodeLlama-13b-Python-hf", "--gpu-mem", "141GiB", "--context", "512", "--json"]
    assert main(args) == 0
    by_bytes = json.loads(capsys.readouterr().out)
    assert by_bytes["cost_ratio"] == pytest.approx(0.516, abs=0.001) and by_bytes["best_k"] > 0
    assert "overhead" not in by_bytes["advice"]
    assert main(args + ["--cost-ratio", "0.91"]) == 0
    given = json.loads(capsys.readouterr().out)
    assert given["cost_ratio"] == 0.91
    assert given["best_k"] == 0 and given["expected_speedup"] == 1.0  # at α = 0.8 no K pays
    assert "per-operation overhead" in given["advice"] and "1.8x what bytes read predict" in given["advice"]
    assert main(args[:-1] + ["--cost-ratio", "0.91"]) == 0
    assert "c = 0.910 (from --cost-ratio)" in capsys.readouterr().out


def test_a_cost_ratio_that_is_not_a_ratio_is_refused(capsys):
    assert main(["doctor", "--draft", CL7, "--target", CL13, "--cost-ratio", "0"]) == 2
    assert "--cost-ratio" in capsys.readouterr().err


def test_measured_cost_ratio_overrides_a_given_one(monkeypatch):
    monkeypatch.setattr(doctor, "measure", lambda engine: (
        {"acceptance_rate": 0.7, "cost_ratio": 0.2, "draft_forward_ms": 2.0, "target_forward_ms": 10.0}, ""))
    p, info = doctor.diagnose(CL7, CL13, 24 * GiB, 4096, cost_ratio=0.9, engine=object())
    assert (p.cost_source, p.cost_ratio) == ("measured", 0.2)
    assert any("--cost-ratio 0.9 ignored" in n for n in info["notes"])


@pytest.mark.slow
def test_an_eagle_head_is_planned_for_its_own_target_and_refused_for_another(tmp_path, capsys):
    """The smol preset's draft is an EAGLE head: no tokenizer of its own, so the doctor applies
    the loader's rule for heads (the target's shape) and measures the head's step as the draft."""
    import torch

    from codespec_lsp.engine.eagle import EagleHead, save_head
    from codespec_lsp.engine.models import load_model
    target = load_model(str(TINY_DIR / "target"), device="cpu", dtype=torch.float32)
    torch.manual_seed(0)
    save_head(EagleHead.for_target(target, torch.arange(500)), tmp_path / "head")
    assert main(["doctor", "--draft", str(tmp_path / "head"), "--target", str(TINY_DIR / "target"),
                 "--context", "1024", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tokenizer_compatible"] is True
    assert out["acceptance_source"] == "measured" and out["cost_ratio"] > 0
    other = doctor.plan_pair(str(tmp_path / "head"), str(TINY_DIR / "draft"), 24 * GiB, 1024)
    assert other["tokenizer_compatible"] is False and "trained for a target" in other["verdict"]
