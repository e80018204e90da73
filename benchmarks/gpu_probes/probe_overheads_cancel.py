"""H200 probe 2 of 5: one Python-launched op's cost, a 13B fp16 forward with and without the
engine's per-layer cancel hooks, and cancel latency per trial (fp16, fp32) of the tiny pair."""
import json, os, statistics, sys, time
import torch
sys.path.insert(0, "scripts")
import gpu_bench
from codespec_lsp.engine import hf, load_engine
from codespec_lsp.bench.engine import engine as bench
OUT = os.environ.get("OUT", "gpu_out")
res = {}
dev = torch.device(os.environ.get("DEV", "cuda"))


def overheads():
    # A: one tiny kernel launched from Python (dispatch + launch), the floor under every op
    x = torch.zeros(16, device=dev)
    for _ in range(200): x.add_(1)
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(5000): x.add_(1)
    torch.cuda.synchronize(); res["us_per_small_op"] = round((time.perf_counter() - t) / 5000 * 1e6, 2)
    print("A", res, flush=True)
    # C: 13B fp16, one token at 512 context, with and without the engine's per-layer cancel hooks
    timer = gpu_bench.Timer(dev)
    m = gpu_bench.build(gpu_bench.model_config("target", False), dev, torch.float16)
    cache = hf.new_cache(m); hf.forward(m, list(range(1, 513)), cache)
    step = lambda: hf.forward(m, [5], cache); back = lambda: hf.crop(cache, 512)
    timer(step, 5, back); res["t13b_1tok_ms"] = round(timer(step, 30, back), 3)
    hooks = hf.install_cancel_check(m, lambda: False)
    timer(step, 3, back); res["t13b_1tok_hooks_ms"] = round(timer(step, 30, back), 3)
    for h in hooks: h.remove()
    # CPU-side time alone: how long Python takes to queue one forward (the GPU not waited for)
    torch.cuda.synchronize(); t = time.perf_counter()
    with torch.inference_mode(): m(input_ids=torch.tensor([[5]], device=dev), past_key_values=cache, use_cache=True)
    res["t13b_cpu_enqueue_ms"] = round((time.perf_counter() - t) * 1e3, 3)
    torch.cuda.synchronize(); hf.crop(cache, 512)
    print("C", res, flush=True)
    del m, cache; torch.cuda.empty_cache()


if dev.type == "cuda":
    overheads()
# B: cancel latency per trial, fp16 and fp32, with the longest target forward seen in each run
for dtype in ("float16", "float32"):
    eng = load_engine(preset="tiny", device=dev.type, dtype=dtype)
    prompts = bench.completion_points(bench.corpus_files(None), 24, eng)
    bench._gen(eng, prompts[0], max_new_tokens=8)
    bench.speed(eng, prompts[:8], 48)
    eng.target_forward_s.clear()
    lat = bench.cancel_latencies(eng, prompts, 60)
    fw = sorted(eng.target_forward_s)
    res[dtype] = {"cancel_ms": [round(v, 2) for v in lat], "p50": round(statistics.median(lat), 2),
                  "p95": round(bench.percentile(lat, 0.95), 2), "max": round(max(lat), 2),
                  "fwd_ms_p50": round(fw[len(fw)//2] * 1e3, 2), "fwd_ms_top5": [round(v * 1e3, 2) for v in fw[-5:]],
                  "forwards": len(fw)}
    print("B", dtype, {k: v for k, v in res[dtype].items() if k != "cancel_ms"}, flush=True)
    print("  ", res[dtype]["cancel_ms"], flush=True)
json.dump(res, open(f"{OUT}/probe_overheads_cancel.json", "w"), indent=1)
