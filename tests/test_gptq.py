"""The GPTQ path: how the loader reads GPTQ folders (always runs, no gptqmodel needed), and one real
round trip through gptqmodel's CPU kernel (runs only where the `gptq` extra is installed; CI's
default install skips it; scripts/quantize_gptq.py is the full version on both models)."""

from __future__ import annotations

import importlib.util
import json
import shutil

import pytest

from codespec_lsp import TINY_DIR
from codespec_lsp.engine import MissingExtraError, ModelLoadError, load_engine
from codespec_lsp.engine import models

GPTQ_PACKAGES = ("gptqmodel", "optimum")  # transformers needs both
HAVE_GPTQ = all(importlib.util.find_spec(name) for name in GPTQ_PACKAGES)


def _only(monkeypatch, installed: set[str]) -> None:
    """Pretend that of the GPTQ packages only `installed` are importable."""
    real = importlib.util.find_spec
    monkeypatch.setattr(models.importlib.util, "find_spec",
                        lambda name, *a: real(name, *a) if name not in GPTQ_PACKAGES
                        else (real(name, *a) or object()) if name in installed else None)


def _gptq_folder(tmp_path, layout: str):
    """The tiny target with a GPTQ quantization config, in config.json ("hf") or in an AutoGPTQ
    quantize_config.json beside it ("autogptq"). The weights are not quantized: these folders only
    reach the loader's checks."""
    folder = tmp_path / layout
    shutil.copytree(TINY_DIR / "target", folder)
    quant = {"bits": 4, "group_size": 64, "desc_act": False, "sym": True}
    if layout == "hf":
        config = json.loads((folder / "config.json").read_text())
        config["quantization_config"] = {"quant_method": "gptq", **quant}
        (folder / "config.json").write_text(json.dumps(config))
    else:
        (folder / "quantize_config.json").write_text(json.dumps(quant))
    return folder


@pytest.mark.parametrize("installed", [set(), {"optimum"}, {"gptqmodel"}])
@pytest.mark.parametrize("layout", ["hf", "autogptq"])
def test_gptq_folder_needs_both_packages_of_the_extra(monkeypatch, tmp_path, installed, layout):
    """transformers' GPTQ integration needs optimum AND gptqmodel; with either missing the loader
    names the extra (it used to pass with one of them and fail inside transformers). A folder that
    keeps its GPTQ config in quantize_config.json is a GPTQ folder too (it used to load as a plain
    model with random weights)."""
    _only(monkeypatch, installed)
    folder = _gptq_folder(tmp_path, layout)
    with pytest.raises(MissingExtraError, match=r"codespec-lsp\[gptq\]") as err:
        load_engine(preset="tiny", target=str(folder), draft="none", device="cpu")
    for name in GPTQ_PACKAGES:
        assert (f"{name} " in str(err.value).split("not installed")[0]) == (name not in installed)


def test_the_gptq_preset_needs_the_extra(monkeypatch):
    _only(monkeypatch, {"optimum"})
    with pytest.raises(MissingExtraError, match="gptqmodel not installed"):
        load_engine(preset="codellama-python-gptq", device="cpu")


@pytest.mark.slow
def test_weights_missing_from_the_checkpoint_are_refused(tmp_path):
    """A config that promises more than the checkpoint holds (here one more layer; in real life a
    quantized checkpoint read as a plain one): transformers only warns and fills in random weights."""
    folder = tmp_path / "seven-layers"
    shutil.copytree(TINY_DIR / "target", folder)
    config = json.loads((folder / "config.json").read_text())
    config["num_hidden_layers"] += 1
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=r"weights are missing from the checkpoint \(model\.layers\.6\."):
        load_engine(preset="tiny", target=str(folder), draft="none", device="cpu")


# ------------------------------------------------------------------ with the extra installed


@pytest.fixture(scope="module")
def quantized_draft(tmp_path_factory):
    """The tiny draft quantized to GPTQ 4-bit on CPU with a small calibration set (seconds)."""
    if not HAVE_GPTQ:
        pytest.skip("the gptq extra (gptqmodel, optimum) is not installed")
    import os
    import sys
    os.environ.setdefault("GPTQMODEL_CPU_WORKERS", "2")  # see scripts/quantize_gptq.py
    sys.path.insert(0, str(TINY_DIR.parent.parent.parent / "scripts"))
    import quantize_gptq
    from gptqmodel import GPTQModel, QuantizeConfig
    from transformers import AutoTokenizer

    out = tmp_path_factory.mktemp("gptq") / "draft"
    tok = AutoTokenizer.from_pretrained(TINY_DIR / "draft")
    cwd = os.getcwd()
    os.chdir(out.parent)  # gptqmodel writes its quantization logs to ./logs
    try:
        model = GPTQModel.load(str(TINY_DIR / "draft"),
                               QuantizeConfig(bits=4, group_size=64, desc_act=False), device="cpu")
        model.quantize(quantize_gptq.calibration(tok, 8, 128), batch_size=1)
        model.save(str(out))
    finally:
        os.chdir(cwd)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TINY_DIR / "draft" / name, out / name)
    return out


@pytest.mark.slow
@pytest.mark.gptq
@pytest.mark.parametrize("role", ["target", "draft"])
def test_quantized_model_through_the_loader_stays_lossless(quantized_draft, role):
    """Plain from_pretrained through load_engine, gptqmodel's CPU kernel: greedy speculative output
    equals the target's own greedy output, with the GPTQ model as the target or as the draft."""
    import torch

    from codespec_lsp.completion.complete import run

    pair = ({"target": str(quantized_draft), "draft": str(TINY_DIR / "draft")} if role == "target"
            else {"target": str(TINY_DIR / "target"), "draft": str(quantized_draft)})
    engine = load_engine(device="cpu", **pair)
    gptq_model = engine.target_model if role == "target" else engine.draft_model
    kernels = {type(m).__module__ for m in gptq_model.modules()}
    assert any(k.startswith("gptqmodel") for k in kernels), kernels
    engine.fixed_k = 3  # draft at every step, so the verify path runs
    for prompt in ("def mean(values):\n    ", "import os\n\n\nclass Config:\n    def __init__(self"):
        ids = engine.encode(prompt)
        plain = run(engine.generate(ids, max_new_tokens=24, speculative=False))
        spec = run(engine.generate(ids, max_new_tokens=24, speculative=True, drafter="model"))
        assert spec.tokens == plain.tokens and len(plain.tokens) > 0
        assert spec.proposed > 0
        with torch.no_grad():
            ref = engine.target_model.generate(torch.tensor([ids]), max_new_tokens=len(plain.tokens),
                                               do_sample=False, pad_token_id=engine.tokenizer.eos_token_id)
        assert ref[0, len(ids):].tolist() == plain.tokens


@pytest.mark.slow
@pytest.mark.gptq
def test_autogptq_layout_loads_as_the_same_gptq_model(quantized_draft, tmp_path):
    """The same checkpoint with its quantization config moved to quantize_config.json (AutoGPTQ's
    layout) loads as the same GPTQ model, not as a plain model with random weights."""
    from codespec_lsp.completion.complete import run

    moved = tmp_path / "autogptq"
    shutil.copytree(quantized_draft, moved)
    config = json.loads((moved / "config.json").read_text())
    (moved / "quantize_config.json").write_text(json.dumps(config.pop("quantization_config")))
    (moved / "config.json").write_text(json.dumps(config))
    outputs = []
    for folder in (quantized_draft, moved):
        engine = load_engine(target=str(folder), draft="none", device="cpu")
        ids = engine.encode("def mean(values):\n    ")
        outputs.append(run(engine.generate(ids, max_new_tokens=16, speculative=False)).tokens)
    assert outputs[0] == outputs[1] and len(outputs[0]) > 0
