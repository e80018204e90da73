"""VRAM plan and expected-speedup model for a draft/target pair, from configs alone.

Promises: pure arithmetic over HF `config.json` dicts (llama / mistral / granite style decoder
stacks), no torch, no I/O, so the server can run it at start and the doctor can run it without a
GPU. The model is memory-bound decoding: one forward costs the bytes it reads (weights it streams
plus the KV cache of the context), which is what bounds single-stream decoding on any recent GPU.

    E(K)       = (1 - α^(K+1)) / (1 - α)        expected tokens per target forward (K+1 at α = 1)
    speedup(K) = E(K) / (1 + K·c)               c = draft cost / target cost per forward
(engine/speedup.py: the functions, shared with adaptive K)
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass

# The speedup model is the engine's (adaptive K applies it to measured numbers); the plan applies
# it to estimated ones.
from codespec_lsp.engine.speedup import K_MAX, best_k, expected_speedup, expected_tokens  # noqa: F401

GiB = 1 << 30

# CUDA context plus cuBLAS/cuDNN workspaces: 0.3-0.5 GiB on recent drivers with lazy module loading.
CUDA_CONTEXT_BYTES = GiB // 2
# Activations and allocator slack: a 2k-token prefill chunk of a 13B model holds ~0.2 GiB of MLP
# intermediates, GPTQ kernels keep scratch buffers, and the caching allocator fragments.
ACTIVATION_BYTES = GiB
RUNTIME_OVERHEAD_BYTES = CUDA_CONTEXT_BYTES + ACTIVATION_BYTES  # 1.5 GiB, stated in every report

# Per-token greedy agreement of a same-family code pair (7B drafting for 13B); speculative decoding
# papers report 0.6-0.9 on code, and 0.8 is what makes the byte-ratio fact "7B/13B caps near 1.2x".
DEFAULT_ACCEPTANCE = 0.8
MIN_USEFUL_SPEEDUP = 1.1     # below this the gain drowns in scheduling noise
HIGH_COST_RATIO = 0.25       # a draft above a quarter of the target's cost caps the speedup early
DISPATCH_BOUND = 1.3         # measured c this far above the bytes ratio: launches, not memory, set it
KV_DTYPE_BYTES = 2           # fp16/bf16 cache, what the engine allocates on a GPU
WEIGHT_DTYPE_BYTES = 2       # unquantized tensors are cast to fp16/bf16 on a GPU, even from fp32

JSON_FIELDS = ("tokenizer_compatible", "draft_params", "target_params", "draft_weights_gib",
               "target_weights_gib", "draft_kv_bytes_per_token", "target_kv_bytes_per_token",
               "max_context", "fits", "cost_ratio", "acceptance_rate", "acceptance_source", "best_k",
               "expected_tokens_per_target_forward", "expected_speedup", "verdict", "advice")


@dataclass(frozen=True)
class Shape:
    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    tied: bool
    max_positions: int
    attention_bias: bool = False
    mlp_bias: bool = False


@dataclass(frozen=True)
class Quant:
    method: str                  # "none", "gptq", "awq", "compressed-tensors"
    bits: int = 16
    group_size: int | None = None  # None: one scale per output channel
    zeros: bool = False          # packed zero points stored next to the scales
    g_idx: bool = False          # GPTQ's int32 group index per input feature

    @property
    def label(self) -> str:
        if self.method == "none":
            return "fp16"
        group = f"g{self.group_size}" if self.group_size else "per-channel"
        return f"{self.method} {self.bits}-bit {group}"


def shape_from_config(cfg: dict) -> Shape:
    heads = cfg["num_attention_heads"]
    return Shape(vocab=cfg["vocab_size"], hidden=cfg["hidden_size"],
                 intermediate=cfg["intermediate_size"], layers=cfg["num_hidden_layers"], heads=heads,
                 kv_heads=cfg.get("num_key_value_heads") or heads,
                 head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
                 tied=bool(cfg.get("tie_word_embeddings", False)),
                 max_positions=cfg.get("max_position_embeddings") or 0,
                 attention_bias=bool(cfg.get("attention_bias", False)),
                 mlp_bias=bool(cfg.get("mlp_bias", False)))


def quant_from_config(cfg: dict) -> Quant:
    """Normalize transformers' `quantization_config` (GPTQ, AWQ, compressed-tensors) to a Quant."""
    qc = cfg.get("quantization_config")
    if not qc:
        return Quant("none")
    method = qc.get("quant_method", "gptq")
    if method in ("gptq", "awq"):
        group = qc.get("group_size", 128)
        return Quant(method, bits=qc.get("bits", 4), group_size=group if group and group > 0 else None,
                     zeros=True, g_idx=method == "gptq")
    if method == "compressed-tensors":
        weights = next(iter(qc["config_groups"].values()))["weights"]
        group = weights.get("group_size") if weights.get("strategy") == "group" else None
        return Quant(method, bits=weights["num_bits"], group_size=group,
                     zeros=not weights.get("symmetric", True))
    raise ValueError(f"quantization method {method!r} is not planned for (gptq, awq, compressed-tensors)")


def decoder_linears(s: Shape) -> list[tuple[int, int]]:
    """(in_features, out_features) of the linears in one decoder layer: q, k, v, o, gate, up, down."""
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    return [(s.hidden, q), (s.hidden, kv), (s.hidden, kv), (q, s.hidden),
            (s.hidden, s.intermediate), (s.hidden, s.intermediate), (s.intermediate, s.hidden)]


def _dense_params_per_layer(s: Shape) -> int:
    """Parameters a quantizer leaves in 16-bit: biases and the two RMSNorm weights."""
    lin = decoder_linears(s)
    bias = (sum(o for _, o in lin[:3]) if s.attention_bias else 0) + (
        sum(o for _, o in lin[4:]) if s.mlp_bias else 0)
    return bias + 2 * s.hidden


def param_count(s: Shape) -> int:
    per_layer = sum(i * o for i, o in decoder_linears(s)) + _dense_params_per_layer(s)
    embeddings = s.vocab * s.hidden * (1 if s.tied else 2)
    return embeddings + s.layers * per_layer + s.hidden  # + final norm


def linear_bytes(fan_in: int, fan_out: int, q: Quant) -> int:
    if q.method == "none":
        return fan_in * fan_out * WEIGHT_DTYPE_BYTES
    groups = math.ceil(fan_in / q.group_size) if q.group_size else 1
    n_scales = groups * fan_out if q.group_size else fan_out
    packed = math.ceil(fan_in * fan_out * q.bits / 8)
    zeros = groups * math.ceil(fan_out * q.bits / 32) * 4 if q.zeros else 0  # int32-packed
    g_idx = fan_in * 4 if q.g_idx else 0
    return packed + n_scales * 2 + zeros + g_idx  # fp16 scales


def weight_bytes(s: Shape, q: Quant) -> int:
    """Resident bytes: quantized decoder linears; embeddings, lm_head and norms stay 16-bit."""
    per_layer = sum(linear_bytes(i, o, q) for i, o in decoder_linears(s))
    dense = (s.layers * _dense_params_per_layer(s) + s.hidden
             + s.vocab * s.hidden * (1 if s.tied else 2)) * WEIGHT_DTYPE_BYTES
    return s.layers * per_layer + dense


def streamed_weight_bytes(s: Shape, q: Quant) -> int:
    """Weight bytes one forward reads: all but an untied embedding table, of which it gathers rows."""
    return weight_bytes(s, q) - (0 if s.tied else s.vocab * s.hidden * WEIGHT_DTYPE_BYTES)


def kv_bytes_per_token(s: Shape) -> int:
    return s.layers * s.kv_heads * s.head_dim * 2 * KV_DTYPE_BYTES  # 2: keys and values


def bytes_read_per_forward(s: Shape, q: Quant, context: int) -> int:
    return streamed_weight_bytes(s, q) + kv_bytes_per_token(s) * context


def max_context(gpu_mem: int, weights: int, kv_per_token: int,
                overhead: int = RUNTIME_OVERHEAD_BYTES, max_positions: int = 0) -> int:
    """Longest context whose KV cache (both models) fits beside both models' weights."""
    free = gpu_mem - overhead - weights
    fit = max(free // kv_per_token, 0)
    return min(fit, max_positions) if max_positions else fit


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def _gib(n: int) -> float:
    return n / GiB


def parse_size(text: str | int | float) -> int:
    """'24GiB', '24 GB', '80G', '25769803776' -> bytes (GB decimal, GiB and bare G binary)."""
    if isinstance(text, (int, float)):
        return int(text)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"cannot read a memory size from {text!r} (try 24GiB or 24GB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


@dataclass
class Plan:
    tokenizer_compatible: bool
    draft_params: int
    target_params: int
    draft_weights_gib: float
    target_weights_gib: float
    draft_kv_bytes_per_token: int
    target_kv_bytes_per_token: int
    max_context: int
    fits: bool
    cost_ratio: float
    acceptance_rate: float
    acceptance_source: str
    best_k: int
    expected_tokens_per_target_forward: float
    expected_speedup: float
    verdict: str
    advice: str
    # report-only details, not part of the JSON contract
    k_used: int = 0
    cost_source: str = "bytes"
    draft_bytes_read: int = 0
    target_bytes_read: int = 0
    needed_bytes: int = 0
    gpu_mem_bytes: int = 0
    context: int = 0

    def to_json_dict(self) -> dict:
        d = asdict(self)
        return {k: d[k] for k in JSON_FIELDS}


def _fit_notes(needed: int, gpu_mem_bytes: int, context: int, max_ctx: int, limit: int
               ) -> tuple[str, list[str]]:
    """(the verdict on memory, advice when it does not fit)."""
    if max_ctx >= context:
        return (f"fits: {_gib(needed):.1f} of {_gib(gpu_mem_bytes):.1f} GiB at {context} tokens "
                f"of context (max {max_ctx})"), []
    if needed > gpu_mem_bytes:
        verdict = (f"does not fit: needs {_gib(needed):.1f} GiB at {context} tokens of context, "
                   f"the card has {_gib(gpu_mem_bytes):.1f} GiB (max context {max_ctx})")
        if max_ctx > 0:
            return verdict, [f"Shorten the context to at most {max_ctx} tokens, or use a smaller "
                             "quantization."]
        return verdict, ["The weights alone do not fit: use a smaller quantization (4-bit GPTQ "
                         "weights take about 0.3 of fp16) or smaller models."]
    return (f"does not fit: {context} tokens of context exceed the {limit} positions the models "
            "know"), [f"Shorten the context to at most {max_ctx} tokens."]


def plan(draft_cfg: dict, target_cfg: dict, gpu_mem_bytes: int, context: int, *,
         k: int | None = None, acceptance: float | None = None, acceptance_source: str | None = None,
         measured_cost_ratio: float | None = None, cost_source: str | None = None,
         tokenizer_compatible: bool = True,
         tokenizer_reason: str = "", k_max: int = K_MAX,
         overhead_bytes: int = RUNTIME_OVERHEAD_BYTES) -> Plan:
    """The whole verdict for one pair. `acceptance` None means the stated DEFAULT_ACCEPTANCE;
    `measured_cost_ratio` None means the bytes-read estimate."""
    ds, ts = shape_from_config(draft_cfg), shape_from_config(target_cfg)
    dq, tq = quant_from_config(draft_cfg), quant_from_config(target_cfg)
    dw, tw = weight_bytes(ds, dq), weight_bytes(ts, tq)
    dkv, tkv = kv_bytes_per_token(ds), kv_bytes_per_token(ts)
    limit = min((p for p in (ds.max_positions, ts.max_positions) if p), default=0)
    max_ctx = max_context(gpu_mem_bytes, dw + tw, dkv + tkv, overhead_bytes, limit)
    fits = max_ctx >= context
    needed = overhead_bytes + dw + tw + (dkv + tkv) * context

    d_read, t_read = bytes_read_per_forward(ds, dq, context), bytes_read_per_forward(ts, tq, context)
    c = measured_cost_ratio if measured_cost_ratio is not None else d_read / t_read
    alpha = DEFAULT_ACCEPTANCE if acceptance is None else acceptance
    source = acceptance_source or ("assumed" if acceptance is None else "given")
    matched_k, matched_s = best_k(alpha, c, k_max)  # what the pair would do with one tokenizer

    if tokenizer_compatible:
        bk, used_alpha = matched_k, alpha
    else:  # ids mean different strings: every proposal is rejected, so drafting only costs
        bk, used_alpha, source = 0, 0.0, "assumed"
    k_used = bk if k is None else k
    e = expected_tokens(used_alpha, k_used)
    s = expected_speedup(used_alpha, k_used, c)
    best_s = expected_speedup(used_alpha, bk, c)

    verdict, advice = [], []
    if not tokenizer_compatible:
        verdict.append(f"incompatible tokenizers ({tokenizer_reason}): the target rejects every "
                       "draft token, so speculative decoding gives no speedup")
        advice.append("Pick a draft that shares the target's tokenizer (same model family), or use "
                      "n-gram drafting, which needs no draft model.")
    fit_verdict, fit_advice = _fit_notes(needed, gpu_mem_bytes, context, max_ctx, limit)
    verdict.append(fit_verdict)
    advice += fit_advice
    if tokenizer_compatible:
        if best_s < MIN_USEFUL_SPEEDUP:
            verdict.append(f"no useful speedup: {best_s:.2f}x at best (K={bk})")
        else:
            verdict.append(f"expected {best_s:.2f}x at K={bk}")
    if c > HIGH_COST_RATIO:
        lead = "Even if the tokenizers matched, the" if not tokenizer_compatible else "The"
        little = ": little speedup" if matched_s < 1.3 else ""
        advice.append(f"{lead} draft costs {c:.2f} of a target forward, so at acceptance {alpha:.2f} the "
                      f"best is {matched_s:.2f}x (K={matched_k}){little}. A smaller draft (about a tenth "
                      "of the target's bytes), a bigger target, or n-gram drafting would do better.")
    elif tokenizer_compatible and best_s < MIN_USEFUL_SPEEDUP:
        advice.append(f"Acceptance {alpha:.2f} is too low for this draft: use a draft trained on "
                      "the same data as the target, or n-gram drafting.")
    if measured_cost_ratio is not None and c > DISPATCH_BOUND * (d_read / t_read):
        advice.append(f"That c is {c / (d_read / t_read):.1f}x what bytes read predict "
                      f"({d_read / t_read:.2f}): the forwards are bound by per-operation overhead (Python "
                      "dispatch, kernel launches), not by memory, and a draft pays it per layer like "
                      "the target. A draft with fewer layers brings c back toward the bytes figure; "
                      "on a GPU, so does an engine that replays CUDA graphs (vLLM, llama-server).")
    if tokenizer_compatible and k is not None and k != bk:
        advice.append(f"K={k} gives {s:.2f}x; K={bk} gives {best_s:.2f}x.")
    if not advice:
        advice.append(f"Use K={bk}.")

    return Plan(tokenizer_compatible=tokenizer_compatible, draft_params=param_count(ds),
                target_params=param_count(ts), draft_weights_gib=round(_gib(dw), 3),
                target_weights_gib=round(_gib(tw), 3), draft_kv_bytes_per_token=dkv,
                target_kv_bytes_per_token=tkv, max_context=max_ctx, fits=fits,
                cost_ratio=round(c, 4), acceptance_rate=round(used_alpha, 4),
                acceptance_source=source, best_k=bk,
                expected_tokens_per_target_forward=round(e, 4), expected_speedup=round(s, 4),
                verdict="; ".join(verdict), advice=" ".join(advice), k_used=k_used,
                cost_source=cost_source or ("measured" if measured_cost_ratio is not None else "bytes"),
                draft_bytes_read=d_read, target_bytes_read=t_read, needed_bytes=needed,
                gpu_mem_bytes=gpu_mem_bytes, context=context)
