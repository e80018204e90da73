"""Load a draft/target pair with transformers, refuse pairs that cannot work, build the Engine.

- A model reference is a local folder, a `.gguf` file (converted once into a folder in the user's
  cache, engine/fetch.py) or a hub id. Hub ids resolve from the local HF cache only,
  unless the user allowed downloads: offline, a missing checkpoint is an error at once, not a hang.
- `trust_remote_code` is off unless the user sets it.
- GPTQ checkpoints load through transformers' GPTQ integration, which needs the `gptq` extra.
- The pairing check (codespec_lsp.engine.pairing, the rule `doctor` reports too) runs before anything
  else is built: a draft whose tokenizer gives other ids than the target's would have every token
  rejected (a "working" setup that is only slower).
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from codespec_lsp import SMOL_EAGLE_DIR, TINY_DIR
from codespec_lsp.engine import cpu_linear, eagle, fetch, hf
from codespec_lsp.engine.api import MissingExtraError, ModelLoadError, TokenizerMismatchError
from codespec_lsp.engine.engine import Engine
from codespec_lsp.engine.pairing import compare_tokenizers
from codespec_lsp.engine.scoring import scoring_for

# Progress bars on stderr are noise in an LSP log and in `complete` output.
hf_logging.disable_progress_bar()


@dataclass(frozen=True)
class Preset:
    draft: str
    target: str  # FETCHED: the folder `codespec-lsp fetch NAME` makes (fetch.preset_dir)
    gptq: bool = False
    note: str = ""


FETCHED = "<fetched>"


PRESETS: dict[str, Preset] = {
    "tiny": Preset(str(TINY_DIR / "draft"), str(TINY_DIR / "target"),
                   note="embedded 6M pair trained on the Python standard library; tests and plumbing"),
    # An EAGLE head over the target's hidden states, with prompt lookup (docs/draft.md).
    "smol": Preset(str(SMOL_EAGLE_DIR), FETCHED, note="SmolLM2-135M (fetched once: `codespec-lsp fetch "
                                                     "smol`) with its EAGLE draft head; the CPU default"),
    "codellama-python": Preset("codellama/CodeLlama-7b-Python-hf", "codellama/CodeLlama-13b-Python-hf",
                               note="fp16: about 39 GB of weights, needs a 48 GB+ card"),
    "codellama-python-gptq": Preset("TheBloke/CodeLlama-7B-Python-GPTQ",
                                    "TheBloke/CodeLlama-13B-Python-GPTQ", gptq=True,
                                    note="4-bit GPTQ: both models plus KV cache fit a 24 GB card"),
}


def default_preset() -> str:
    # Without CUDA smol, fetched or not: an unfetched one is an error naming the fetch command
    # (load_engine), never a quiet fall-back to the test pair.
    return "codellama-python-gptq" if torch.cuda.is_available() else "smol"


def preset_target(name: str) -> str:
    """The preset's target reference; ModelLoadError naming the fetch command when unfetched."""
    target = PRESETS[name].target
    if target != FETCHED:
        return target
    folder = fetch.preset_dir(name)
    if not fetch.is_converted(folder):
        raise ModelLoadError(fetch.not_fetched_message(name))
    return str(folder)


def resolve_ref(ref: str | None) -> str | None:
    """A `.gguf` file becomes its converted folder (converted on first use); others pass."""
    if ref is not None and ref.lower().endswith(".gguf") and _looks_local(ref):
        return str(fetch.gguf_folder(ref))
    return ref


def resolve_device(device: str = "auto") -> str:
    if device in (None, "", "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(f"device {device!r} requested but this torch build sees no CUDA GPU "
                             f"(torch {torch.__version__}); use --device cpu or install a CUDA torch")
    return device


def resolve_dtype(dtype: str | None, device: str) -> torch.dtype:
    if dtype:
        try:
            return {"float16": torch.float16, "fp16": torch.float16, "bfloat16": torch.bfloat16,
                    "bf16": torch.bfloat16, "float32": torch.float32, "fp32": torch.float32}[dtype]
        except KeyError:
            raise ModelLoadError(f"unknown dtype {dtype!r}: use float16, bfloat16 or float32") from None
    # fp16 matmuls are slow or unsupported on CPUs; the embedded pair is stored fp16 and upcast.
    return torch.float32 if device == "cpu" else torch.float16


def _local_config(ref: str) -> dict | None:
    """A local folder's config.json, with an AutoGPTQ-style quantize_config.json folded in under
    "quantization_config" (the doctor reads folders the same way). None for a hub id."""
    path = Path(ref).expanduser()
    if not path.is_dir():
        return None
    config = path / "config.json"
    if not config.is_file():
        raise ModelLoadError(f"{path} is not a model folder: it has no config.json")
    try:
        cfg = json.loads(config.read_text())
        qfile = path / "quantize_config.json"
        if "quantization_config" not in cfg and qfile.is_file():
            cfg["quantization_config"] = {"quant_method": "gptq", **json.loads(qfile.read_text())}
        return cfg
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{path}: a config file is not valid JSON: {exc}") from None


def _is_gptq(config: dict | None) -> bool:
    quant = (config or {}).get("quantization_config") or {}
    return str(quant.get("quant_method", "")).lower() == "gptq"


# transformers' GPTQ integration needs both: optimum converts the layers, gptqmodel runs them.
GPTQ_PACKAGES = ("gptqmodel", "optimum")


def require_gptq(what: str) -> None:
    missing = [name for name in GPTQ_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        raise MissingExtraError(
            f"{what} is a GPTQ checkpoint, which needs the optional GPTQ support ({' and '.join(missing)} "
            f"not installed): pip install 'codespec-lsp[gptq]' (it pulls a CUDA torch of several GB), "
            f"or pick --preset tiny / codellama-python")


def _looks_local(ref: str) -> bool:
    return ref.startswith((".", "/", "~")) or Path(ref).expanduser().exists()


def load_tokenizer(ref: str, *, allow_download: bool = False,
                   trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    try:
        return AutoTokenizer.from_pretrained(ref, local_files_only=not allow_download,
                                             trust_remote_code=trust_remote_code)
    except Exception as exc:  # transformers raises OSError, ValueError, json and tokenizers errors
        raise ModelLoadError(_explain(ref, "tokenizer", exc, allow_download)) from None


def load_model(ref: str, *, device: str, dtype: torch.dtype, allow_download: bool = False,
               trust_remote_code: bool = False):
    config = _local_config(ref)
    extra = {}
    if _is_gptq(config):
        require_gptq(ref)
        # transformers reads quantization_config from config.json only: a folder that keeps it in
        # quantize_config.json (AutoGPTQ's layout) would load as a plain model with its quantized
        # weights dropped and the rest random. Hand it the folded config instead.
        extra["config"] = AutoConfig.from_pretrained(ref, local_files_only=True,
                                                     trust_remote_code=trust_remote_code)
        extra["config"].quantization_config = config["quantization_config"]
    hf.use_length_agnostic_attention()
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            ref, dtype=dtype, local_files_only=not allow_download, output_loading_info=True,
            trust_remote_code=trust_remote_code, device_map=device if device != "cpu" else None, **extra)
    except torch.OutOfMemoryError:
        raise ModelLoadError(f"out of GPU memory loading {ref}: pick a smaller preset (GPTQ), a "
                             f"smaller draft, or free the GPU (`codespec-lsp doctor` shows the plan)") from None
    except Exception as exc:
        raise ModelLoadError(_explain(ref, "model", exc, allow_download)) from None
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        # transformers only warns and initializes them at random: a model that "works" and
        # completes garbage. Typical cause: a quantized checkpoint whose config does not say so.
        raise ModelLoadError(f"cannot load the model from {ref}: {len(missing)} weights are missing from "
                             f"the checkpoint ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}); "
                             f"is it a quantized checkpoint whose config.json has no quantization_config, "
                             f"or a config that does not match the weights?")
    if device == "cpu":
        hf.use_cpu_attention(model)
        model.cpu_linear_plan = cpu_linear.install(model, cpu_linear.plan_cache())
    return model.eval()


def _explain(ref: str, what: str, exc: Exception, allow_download: bool) -> str:
    if _looks_local(ref):
        return f"cannot load the {what} from folder {ref}: {type(exc).__name__}: {exc}"
    if not allow_download:
        return (f"{ref} is not a local folder and is not in the local Hugging Face cache; downloads "
                f"are off. Download it yourself, point to a local folder, or allow downloads "
                f"(--allow-download / allowDownload). ({type(exc).__name__})")
    return f"cannot load the {what} {ref}: {type(exc).__name__}: {exc}"


def check_pair(draft_tok: PreTrainedTokenizerBase, target_tok: PreTrainedTokenizerBase,
               draft_name: str, target_name: str) -> None:
    """Raise TokenizerMismatchError unless the pair passes the pairing rule (codespec_lsp.engine.pairing),
    with the same reason `doctor` reports for it."""
    check = compare_tokenizers(draft_tok, target_tok)
    if not check.compatible:
        raise TokenizerMismatchError(check.refusal(draft_name, target_name))


def load_engine(preset: str | None = None, draft: str | None = None, target: str | None = None,
                device: str = "auto", dtype: str | None = None, allow_download: bool = False,
                trust_remote_code: bool = False, drafter: str = "auto", exact: bool = False,
                **engine_options) -> Engine:
    """Build an Engine from a preset, with `draft`/`target` overriding it. draft="none" runs the
    target with n-gram drafting only. `engine.scoring` is the preset's measured knobs when the
    target is the preset's own, else (and with `exact`) the pure target (engine/scoring.py)."""
    preset = preset or default_preset()
    if preset not in PRESETS:
        raise ModelLoadError(f"unknown preset {preset!r}: choose one of {', '.join(PRESETS)}")
    chosen = PRESETS[preset]
    target_ref = resolve_ref(target) if target else preset_target(preset)
    draft_ref = draft or chosen.draft
    draft_ref = None if draft_ref in ("none", "") else resolve_ref(draft_ref)
    if chosen.gptq and not (target or draft):
        require_gptq(f"preset {preset}")
    device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, device)
    opts = dict(allow_download=allow_download, trust_remote_code=trust_remote_code)
    for ref in (target_ref, draft_ref):
        if ref is not None:
            _local_config(ref)  # a folder that is not a model folder says so before anything loads

    # An EAGLE head has no tokenizer of its own: it reads the target's embedding and hidden
    # states, and load_head refuses a target of another shape or vocabulary.
    head_only = draft_ref is not None and eagle.is_eagle_folder(draft_ref)
    target_tok = load_tokenizer(target_ref, **opts)
    if draft_ref is not None and not head_only:
        check_pair(load_tokenizer(draft_ref, **opts), target_tok, draft_ref, target_ref)
    target_model = load_model(target_ref, device=device, dtype=torch_dtype, **opts)
    draft_model = eagle_head = None
    if head_only:
        eagle_head = eagle.load_head(draft_ref, target_model)
    elif draft_ref is not None:
        draft_model = load_model(draft_ref, device=device, dtype=torch_dtype, **opts)
    engine = Engine(target_model, draft_model, target_tok, preset=preset, target_name=target_ref,
                    draft_name=draft_ref, device=device, drafter=drafter, eagle_head=eagle_head,
                    **engine_options)
    engine.scoring = scoring_for(preset, own_target=not target, exact=exact)
    return engine

