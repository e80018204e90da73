"""`codespec-lsp doctor`: will this draft/target pair fit one GPU, and will it speed up?

Promises: each model name resolves to its config and tokenizer facts without the network (the
preset `tiny`, a local folder, or a hub id from the shipped catalog); the tokenizers are compared
by the loader's own rule, codespec_lsp.engine.pairing (token by token when both are on disk, by recorded
facts otherwise), so a pair called compatible here is one the loader accepts; when both models load
locally, acceptance and cost are measured with the engine on the held-out corpus; the numbers
then go through planner.plan. `plan_pair` is the same check for the server to run at start.
"""

from __future__ import annotations

import functools
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from codespec_lsp import TINY_DIR
from codespec_lsp.engine import pairing
from codespec_lsp.planning import planner

PACKAGE = Path(__file__).resolve().parent
CATALOG_PATH = PACKAGE / "catalog" / "models.json"
# The tokenizer check is the loader's own rule, so a pair the doctor calls compatible loads.
TokenizerCheck = pairing.PairCheck


class DoctorError(ValueError):
    """A model name or flag the doctor cannot use; the message is for the user."""


@dataclass
class ModelRef:
    name: str
    kind: str                      # "catalog" or "local"
    config: dict
    path: Path | None = None
    entry: dict | None = None      # the catalog entry: family, tokenizer facts, source


@functools.cache
def load_catalog() -> dict:
    return json.loads(CATALOG_PATH.read_text(encoding="utf-8"))


def read_local_config(path: Path) -> dict:
    """config.json, with an AutoGPTQ-style quantize_config.json folded in as transformers does."""
    cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
    qfile = path / "quantize_config.json"
    if "quantization_config" not in cfg and qfile.is_file():
        cfg["quantization_config"] = {"quant_method": "gptq", **json.loads(qfile.read_text(encoding="utf-8"))}
    return cfg


def resolve(name: str, role: str) -> ModelRef:
    """`tiny` -> the embedded model for this role; an existing folder; else a catalog hub id."""
    if name == "tiny":
        return ModelRef(name, "local", read_local_config(TINY_DIR / role), path=TINY_DIR / role)
    path = Path(name).expanduser()
    if (path / "config.json").is_file():
        return ModelRef(name, "local", read_local_config(path), path=path.resolve())
    catalog = load_catalog()
    key = next((k for k in catalog if k.lower() == name.lower()), None)
    if key is None:
        raise DoctorError(f"{role} {name!r} is neither a folder with a config.json, the preset 'tiny', "
                          f"nor a catalog entry; the catalog knows: {', '.join(catalog)}")
    return ModelRef(key, "catalog", catalog[key]["config"], entry=catalog[key])


@functools.cache
def _load_tokenizer(path: Path):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)


def tokenizer_facts(ref: ModelRef) -> dict:
    """What the catalog records, or the same facts read off a tokenizer on disk."""
    if ref.entry is not None:
        return {"family": ref.entry["family"], **ref.entry["tokenizer"]}
    tok = _load_tokenizer(ref.path)
    return {"family": ref.config.get("model_type"), "class": type(tok).__name__, "vocab": None,
            "vocab_size": len(tok), "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id,
            "special_tokens": list(tok.all_special_tokens)}


def check_tokenizers(d: ModelRef, t: ModelRef) -> TokenizerCheck:
    if "eagle" in d.config:  # an EAGLE head: no tokenizer of its own, the target's shape decides
        return pairing.compare_eagle(d.config, t.config)
    if d.kind == t.kind == "local":
        return pairing.compare_tokenizers(_load_tokenizer(d.path), _load_tokenizer(t.path))
    return pairing.compare_facts(tokenizer_facts(d), tokenizer_facts(t), d.kind == t.kind == "catalog")


def load_pair_engine(d: ModelRef, t: ModelRef):
    """The engine for two local models, or None with the reason when they cannot be loaded here."""
    try:
        from codespec_lsp.engine import load_engine
        if d.name == t.name == "tiny":
            return load_engine(preset="tiny"), ""
        return load_engine(draft=str(d.path), target=str(t.path)), ""
    except Exception as exc:  # noqa: BLE001 - any load failure falls back to the byte estimate
        return None, f"{type(exc).__name__}: {exc}"


def measure(engine) -> tuple[dict | None, str]:
    """α and c on the held-out corpus, or None with the reason (the doctor must still answer)."""
    try:
        from codespec_lsp.bench.engine import measure_pair
        return measure_pair(engine), ""
    except Exception as exc:  # noqa: BLE001
        return None, f"{type(exc).__name__}: {exc}"


def diagnose(draft: str | ModelRef, target: str | ModelRef, gpu_mem_bytes: int, context: int, *,
             k: int | None = None, acceptance: float | None = None, cost_ratio: float | None = None,
             engine=None, load: bool = False) -> tuple[planner.Plan, dict]:
    """The plan plus what the text report needs. `load`: build an engine for two local models.
    `cost_ratio`: c measured elsewhere (scripts/gpu_bench.py on the user's card), which the bytes
    estimate cannot know: on a GPU where dispatch, not memory, bounds a forward, c nears 1."""
    d = draft if isinstance(draft, ModelRef) else resolve(draft, "draft")
    t = target if isinstance(target, ModelRef) else resolve(target, "target")
    if acceptance is not None and not 0.0 <= acceptance <= 1.0:
        raise DoctorError(f"--acceptance must lie in [0, 1], not {acceptance}")
    if cost_ratio is not None and not 0.0 < cost_ratio <= 10.0:
        raise DoctorError(f"--cost-ratio is a draft forward's time over a target forward's, in (0, 10], "
                          f"not {cost_ratio}")
    tok = check_tokenizers(d, t)
    notes, measured = [], None
    if engine is None and load and tok.compatible and d.kind == t.kind == "local":
        engine, why = load_pair_engine(d, t)
        if engine is None:
            notes.append(f"could not load the pair to measure it ({why}); using the estimates")
    if engine is not None and tok.compatible:
        measured, why = measure(engine)
        if measured is None:
            notes.append(f"could not measure the pair ({why}); using the estimates")
        else:
            if acceptance is not None:
                notes.append(f"--acceptance {acceptance} ignored: measured {measured['acceptance_rate']:.3f}")
            if cost_ratio is not None:
                notes.append(f"--cost-ratio {cost_ratio} ignored: measured {measured['cost_ratio']:.3f}")
    p = planner.plan(
        d.config, t.config, gpu_mem_bytes, context, k=k,
        acceptance=measured["acceptance_rate"] if measured else acceptance,
        acceptance_source="measured" if measured else None,
        measured_cost_ratio=measured["cost_ratio"] if measured else cost_ratio,
        cost_source="measured" if measured else ("given" if cost_ratio is not None else None),
        tokenizer_compatible=tok.compatible, tokenizer_reason=tok.reason)
    return p, {"draft": d, "target": t, "tokenizer": tok, "measured": measured, "notes": notes}


def plan_pair(draft: str, target: str, gpu_mem_bytes: int, context: int, k: int | None = None,
              acceptance: float | None = None, cost_ratio: float | None = None, engine=None) -> dict:
    """The doctor's JSON fields for a pair; with `engine` (already loaded) α and c are measured."""
    return diagnose(draft, target, gpu_mem_bytes, context, k=k, acceptance=acceptance,
                    cost_ratio=cost_ratio, engine=engine)[0].to_json_dict()


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.2f} GiB"


def _describe(ref: ModelRef, params: int, weights_gib: float, kv: int) -> str:
    q = planner.quant_from_config(ref.config)
    where = f"catalog, {ref.entry['family']}" if ref.entry else f"local {ref.path}"
    count = f"{params / 1e9:.2f} B" if params >= 1e9 else f"{params / 1e6:.1f} M"
    return (f"{ref.name} ({where}, {q.label})\n"
            f"             {count} params, {_bytes(weights_gib * planner.GiB)} weights, "
            f"{_bytes(kv)} KV cache per token")


def format_report(p: planner.Plan, info: dict) -> str:
    tok, gib = info["tokenizer"], 1 / planner.GiB
    alpha_note = {"measured": "measured on the held-out corpus",
                  "given": "from --acceptance",
                  "assumed": (f"assumed: the stated default {planner.DEFAULT_ACCEPTANCE} for a same-family pair"
                              if p.tokenizer_compatible else "assumed: mismatched tokenizers accept nothing")}
    cost = {"measured": "measured forward times",
            "given": "from --cost-ratio",
            "bytes": (f"bytes read per forward at {p.context} tokens: {_bytes(p.draft_bytes_read)} vs "
                      f"{_bytes(p.target_bytes_read)}")}[p.cost_source]
    ks = range(0, planner.K_MAX + 1)
    alpha = p.acceptance_rate
    table = "  ".join(f"K={k}:{planner.expected_speedup(alpha, k, p.cost_ratio):.2f}x" for k in ks)
    lines = [
        f"draft        {_describe(info['draft'], p.draft_params, p.draft_weights_gib, p.draft_kv_bytes_per_token)}",
        f"target       {_describe(info['target'], p.target_params, p.target_weights_gib, p.target_kv_bytes_per_token)}",
        f"tokenizers   {'compatible' if tok.compatible else 'INCOMPATIBLE'}: {tok.reason}",
        *[f"             {line}" for line in tok.details if line != tok.reason],
        f"memory       {p.gpu_mem_bytes * gib:.1f} GiB = {planner.RUNTIME_OVERHEAD_BYTES * gib:.1f} runtime "
        f"overhead (CUDA context 0.5 + activations 1.0) + "
        f"{_bytes((p.draft_weights_gib + p.target_weights_gib) * planner.GiB)} weights + "
        f"{_bytes(p.draft_kv_bytes_per_token + p.target_kv_bytes_per_token)} per token of context",
        f"context      max {p.max_context} tokens; asked {p.context}: {'fits' if p.fits else 'does NOT fit'}",
        f"cost ratio   c = {p.cost_ratio:.3f} ({cost})",
        f"acceptance   α = {p.acceptance_rate:.3f} ({alpha_note[p.acceptance_source]})",
        f"speedup      {table}",
        f"             K={p.k_used}: {p.expected_tokens_per_target_forward:.2f} tokens per target "
        f"forward, {p.expected_speedup:.2f}x; best K={p.best_k}",
        *[f"note         {n}" for n in info["notes"]],
        f"verdict      {p.verdict}",
        f"advice       {p.advice}",
    ]
    return "\n".join(lines)


def run_doctor(args) -> int:
    try:
        gpu_mem = planner.parse_size(args.gpu_mem)
        p, info = diagnose(args.draft, args.target, gpu_mem, args.context, k=args.k,
                           acceptance=args.acceptance, cost_ratio=args.cost_ratio,
                           load=True)
    except (DoctorError, ValueError) as exc:
        print(f"codespec-lsp doctor: {exc}", file=sys.stderr)
        return 2
    out = p.to_json_dict()
    launch = add_launch(getattr(args, "launch", None), p, info, out)
    print(json.dumps(out, indent=2) if args.json else format_report(p, info) + launch)
    return 0


# ---------------------------------------------------------------- --launch: the pair on a server
# Kept in one block (owned by the remote backend's work): from the plan's own numbers to the
# command that serves the same pair with speculative decoding in vLLM or llama-server.

LLAMA_SERVER_NOTE = ("llama-server loads GGUF files: convert both checkpoints with llama.cpp's "
                     "convert_hf_to_gguf.py and pass their paths; builds older than the "
                     "--spec-draft-n-max flag call it --draft-max")


def _served_name(ref: ModelRef) -> str:
    """What the server loads: the folder for local models (the embedded pair), else the hub id."""
    return str(ref.path) if ref.path is not None else ref.name


def _memory_fraction(p: planner.Plan, context: int) -> float:
    """vLLM's --gpu-memory-utilization: what the plan needs at `context` tokens, rounded up to
    0.05 plus 0.05 of headroom (vLLM's own workspace is larger than the planner's overhead)."""
    need = (planner.RUNTIME_OVERHEAD_BYTES + (p.draft_weights_gib + p.target_weights_gib) * planner.GiB
            + (p.draft_kv_bytes_per_token + p.target_kv_bytes_per_token) * context)
    share = -(-need * 20 // p.gpu_mem_bytes) / 20 + 0.05
    return round(min(max(share, 0.1), 0.95), 2)


def launch_command(server: str, p: planner.Plan, info: dict) -> str | None:
    """The command line, or None when the pair does not fit at all (nothing to launch)."""
    import shlex
    context = min(p.context, p.max_context)
    if context < 1:
        return None
    k = max(p.best_k, 1)  # a server launched for speculation drafts at least one token
    target, draft = _served_name(info["target"]), _served_name(info["draft"])
    if server == "vllm":
        spec = json.dumps({"method": "draft_model", "model": draft, "num_speculative_tokens": k})
        parts = ["vllm", "serve", target, "--speculative-config", spec, "--max-model-len",
                 str(context), "--gpu-memory-utilization", str(_memory_fraction(p, context))]
        if planner.quant_from_config(info["target"].config).method == "gptq":
            parts += ["--quantization", "gptq"]
        return shlex.join(parts)
    if server == "llama-server":
        gguf = lambda ref: Path(_served_name(ref)).name + ".gguf"  # noqa: E731
        return shlex.join(["llama-server", "-m", gguf(info["target"]), "-md", gguf(info["draft"]),
                           "--spec-draft-n-max", str(k), "-c", str(context), "--cache-reuse", "256",
                           "-ngl", "99", "-ngld", "99", "--host", "127.0.0.1", "--port", "8080"])
    raise DoctorError(f"--launch {server!r}: choose vllm or llama-server")


def add_launch(server: str | None, p: planner.Plan, info: dict, out: dict | None) -> str:
    """Adds `launch_command` to the JSON dict `out`; returns the text report's lines."""
    if not server:
        return ""
    command = launch_command(server, p, info)
    if out is not None:
        out["launch_command"] = command
    if command is None:
        return "\nlaunch       none: the pair does not fit at any context"
    note = f"\n             {LLAMA_SERVER_NOTE}" if server == "llama-server" else ""
    if "--quantization gptq" in command:
        note = "\n             on Ampere or newer GPUs, --quantization gptq_marlin runs faster"
    return f"\nlaunch       {command}{note}"
