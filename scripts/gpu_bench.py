#!/usr/bin/env python
"""GPU figures behind the planner: random-weight CodeLlama-7B (draft) and -13B (target) in fp16.

Both models are built (fp16; fp32 when --tiny runs on CPU) from the catalog's published configs, so nothing is downloaded; random
weights read and multiply exactly like trained ones. Writes one JSON with:
  target_forward_ms[ctx][n]   one target forward verifying n = 1..8 tokens on a ctx-token cache
  draft_forward_ms[ctx]       one draft forward (one token) on a ctx-token cache
  cost_ratio[ctx]             draft_forward_ms / target_forward_ms[ctx]["1"], the planner's c
  prefill_ms[model][len]      one forward over a whole prompt of that length
  achieved_bandwidth_bytes_per_s[model][ctx] = (streamed weights + KV read) / one-token forward
  nominal_bandwidth_bytes_per_s from the device name (null when unknown), and their ratio
  cudnn_attention             false: the models run the attention kernels the engine runs
                              (hf.use_length_agnostic_attention; the H200 run predates the field)
Budget: under 8 minutes on one H200 (build ~1 min per model, ~250 timed forwards, a few prefills);
--budget-s stops early and marks the JSON truncated rather than overrun.

    python scripts/gpu_bench.py --out benchmarks/results/gpu_bench_h200.json
    python scripts/gpu_bench.py --tiny --device cpu --out /tmp/gpu_bench_tiny.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

from codespec_lsp.planning import planner
from codespec_lsp.planning.doctor import load_catalog
from codespec_lsp.engine import hf

DRAFT_ID, TARGET_ID = "codellama/CodeLlama-7b-Python-hf", "codellama/CodeLlama-13b-Python-hf"
CONTEXTS = (512, 2048)
VERIFY = range(1, 9)
PREFILL = (128, 512, 1024, 2048, 4096)
# Nominal HBM/GDDR bandwidth by device-name substring; order matters ("A100" before "A10", "L40S" before "L4").
NOMINAL = (("H200", 4.8e12), ("H100 NVL", 3.9e12), ("H100 PCIe", 2.0e12), ("H100", 3.35e12),
           ("A100", 2.0e12), ("A10", 0.6e12), ("L40S", 0.864e12), ("L4", 0.3e12),
           ("RTX 4090", 1.008e12), ("RTX 3090", 0.936e12), ("V100", 0.9e12), ("T4", 0.32e12))
TINY = {"draft": dict(vocab_size=1024, hidden_size=64, intermediate_size=172, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=4096),
        "target": dict(vocab_size=1024, hidden_size=128, intermediate_size=344, num_hidden_layers=4,
                       num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=4096)}


def nominal_bandwidth(name: str) -> float | None:
    return next((bw for key, bw in NOMINAL if key.lower() in name.lower()), None)


def dtype_for(device: torch.device) -> torch.dtype:
    """fp16 on a GPU (what the engine serves in); fp32 on CPU, whose fp16 kernels are emulated."""
    return torch.float16 if device.type == "cuda" else torch.float32


def model_config(role: str, tiny: bool) -> dict:
    if tiny:
        return {**TINY[role], "tie_word_embeddings": False}
    cfg = load_catalog()[DRAFT_ID if role == "draft" else TARGET_ID]["config"]
    return {k: v for k, v in cfg.items() if k not in ("architectures", "torch_dtype")}


def build(cfg: dict, device: torch.device, dtype: torch.dtype) -> LlamaForCausalLM:
    hf.use_length_agnostic_attention()  # the attention kernels the engine runs (models.load_model)
    with torch.device(device):  # allocate and initialize on the card: no 26 GB host round trip
        model = LlamaForCausalLM._from_config(LlamaConfig(**cfg), dtype=dtype)
    return model.eval()


class Timer:
    """Median milliseconds of `reps` runs; CUDA events on a GPU so queued kernels are counted."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def __call__(self, fn, reps: int, after=lambda: None) -> float:
        times = []
        for _ in range(reps):
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
            after()  # cache rollback stays outside the timed window
        return statistics.median(times)


def decode_times(model, vocab: int, timer: Timer, reps: int, warmup: int, tokens) -> dict:
    """{ctx: {n: ms}}: a ctx-token cache is prefilled once, then each timed forward is cropped back."""
    out = {}
    gen = torch.Generator().manual_seed(0)
    for ctx in CONTEXTS:
        cache = hf.new_cache(model)
        hf.forward(model, torch.randint(vocab, (ctx,), generator=gen).tolist(), cache)
        out[str(ctx)] = {}
        for n in tokens:
            ids = torch.randint(vocab, (n,), generator=gen).tolist()
            step = lambda: hf.forward(model, ids, cache)  # noqa: E731
            back = lambda: hf.crop(cache, ctx)  # noqa: E731
            timer(step, warmup, back)
            out[str(ctx)][str(n)] = round(timer(step, reps, back), 4)
        del cache
    return out


def prefill_times(model, vocab: int, timer: Timer, reps: int, lengths) -> dict:
    gen = torch.Generator().manual_seed(1)
    out = {}
    for length in lengths:
        ids = torch.randint(vocab, (length,), generator=gen).tolist()
        out[str(length)] = round(timer(lambda: hf.forward(model, ids, hf.new_cache(model)), reps), 4)
    return out


def bench_model(role: str, args, device: torch.device, timer: Timer, deadline: float) -> dict:
    cfg = model_config(role, args.tiny)
    t0 = time.perf_counter()
    model = build(cfg, device, dtype_for(device))
    built_s = time.perf_counter() - t0
    shape, quant = planner.shape_from_config(cfg), planner.quant_from_config(cfg)
    tokens = VERIFY if role == "target" else (1,)
    res = {"config": cfg, "params": planner.param_count(shape), "build_s": round(built_s, 2),
           "streamed_weight_bytes": planner.streamed_weight_bytes(shape, quant),
           "kv_bytes_per_token": planner.kv_bytes_per_token(shape)}
    timer(lambda: hf.forward(model, [1, 2, 3], hf.new_cache(model)), args.warmup)  # kernels, cuBLAS
    res["forward_ms"] = decode_times(model, cfg["vocab_size"], timer, args.reps, args.warmup, tokens)
    lengths = [n for n in PREFILL if n <= (512 if args.tiny else cfg["max_position_embeddings"])]
    if time.perf_counter() < deadline:
        res["prefill_ms"] = prefill_times(model, cfg["vocab_size"], timer, max(args.reps // 3, 1), lengths)
    res["achieved_bandwidth_bytes_per_s"] = {
        ctx: round((res["streamed_weight_bytes"] + res["kv_bytes_per_token"] * int(ctx)) / (ms["1"] / 1e3))
        for ctx, ms in res["forward_ms"].items()}
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/gpu_bench.json")
    ap.add_argument("--tiny", action="store_true", help="tiny configs: checks the script, CPU allowed")
    ap.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda; cpu with --tiny)")
    ap.add_argument("--reps", type=int, default=None, help="timed runs per point (default 15, tiny 2)")
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--budget-s", type=float, default=450.0, help="skip prefill timings past this")
    args = ap.parse_args(argv)
    args.reps = args.reps or (2 if args.tiny else 15)
    args.warmup = args.warmup or (1 if args.tiny else 3)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() or not args.tiny else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_bench: no CUDA device; use --tiny --device cpu to check the script", file=sys.stderr)
        return 2
    threads = torch.get_num_threads()
    if device.type == "cpu":  # CPU runs only check the script; BLAS threads on a busy box cost 20x
        torch.set_num_threads(1)
    try:
        return run(args, device)
    finally:
        torch.set_num_threads(threads)


def run(args, device: torch.device) -> int:
    torch.manual_seed(0)
    started = time.perf_counter()
    deadline = started + args.budget_s
    timer = Timer(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    nominal = nominal_bandwidth(name) if device.type == "cuda" else None

    target = bench_model("target", args, device, timer, deadline)
    draft = bench_model("draft", args, device, timer, deadline)
    achieved = {"target": target.pop("achieved_bandwidth_bytes_per_s"),
                "draft": draft.pop("achieved_bandwidth_bytes_per_s")}
    result = {
        "device": str(device), "device_name": name, "dtype": str(dtype_for(device)).removeprefix("torch."), "tiny": args.tiny,
        "models": {"draft": DRAFT_ID if not args.tiny else "tiny-draft",
                   "target": TARGET_ID if not args.tiny else "tiny-target"},
        "contexts": list(CONTEXTS), "repetitions": args.reps,
        "cudnn_attention": torch.backends.cuda.cudnn_sdp_enabled(),
        "target_forward_ms": target.pop("forward_ms"),
        "draft_forward_ms": {ctx: ms["1"] for ctx, ms in draft.pop("forward_ms").items()},
        "prefill_ms": {"target": target.pop("prefill_ms", None), "draft": draft.pop("prefill_ms", None)},
        "achieved_bandwidth_bytes_per_s": achieved,
        "nominal_bandwidth_bytes_per_s": nominal,
        "bandwidth_fraction": {m: {c: round(v / nominal, 4) for c, v in per.items()} if nominal else None
                               for m, per in achieved.items()},
        "target": target, "draft": draft,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "cuda": torch.version.cuda, "python": sys.version.split()[0]},
    }
    result["cost_ratio"] = {ctx: round(result["draft_forward_ms"][ctx] / result["target_forward_ms"][ctx]["1"], 4)
                            for ctx in result["draft_forward_ms"]}
    result["wall_s"] = round(time.perf_counter() - started, 1)
    result["truncated"] = result["prefill_ms"]["draft"] is None
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"gpu_bench: {name}, cost ratio {result['cost_ratio']}, {result['wall_s']} s -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
