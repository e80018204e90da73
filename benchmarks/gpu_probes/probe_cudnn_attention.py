"""H200 probe 5 of 5: does cuDNN attention cost a plan build per new KV length? SDPA alone, then
the engine, with PyTorch's cuDNN attention backend off and on."""
import json, os, statistics, time
import torch
import torch.nn.functional as F
from codespec_lsp.engine import load_engine
from codespec_lsp.bench.engine import engine as bench
OUT = os.environ.get("OUT", "gpu_out")
res = {"cudnn_sdp_default": torch.backends.cuda.cudnn_sdp_enabled(), "torch": torch.__version__}
q = torch.randn(1, 4, 1, 64, device="cuda", dtype=torch.bfloat16)
def sdpa_first_calls(n0):
    out = []
    for L in range(n0, n0 + 20):
        k = torch.randn(1, 4, L, 64, device="cuda", dtype=torch.bfloat16)
        torch.cuda.synchronize(); t = time.perf_counter()
        F.scaled_dot_product_attention(q, k, k); torch.cuda.synchronize()
        out.append(round((time.perf_counter() - t) * 1e3, 2))
    return out
res["sdpa_new_len_ms_cudnn_on"] = sdpa_first_calls(1000)
torch.backends.cuda.enable_cudnn_sdp(False)
res["sdpa_new_len_ms_cudnn_off"] = sdpa_first_calls(2000)
print(res, flush=True)
eng = load_engine(preset="tiny", device="cuda", dtype="bfloat16")
prompts = bench.completion_points(bench.corpus_files(None), 8, eng)
bench._gen(eng, prompts[7], max_new_tokens=8)
for phase, cudnn in (("off", False), ("on", True)):
    torch.backends.cuda.enable_cudnn_sdp(cudnn)
    for j, spec in ((0, False), (1, True)):
        i = (0 if phase == "off" else 2) + j
        bench._prefill(eng, prompts[i], f"p{i}")
        eng.target_forward_s.clear()
        t = time.perf_counter()
        bench._gen(eng, prompts[i], max_new_tokens=150, key=f"p{i}", speculative=spec)
        fw = [v * 1e3 for v in eng.target_forward_s]
        res[f"engine_cudnn_{phase}_spec_{spec}"] = {"wall_ms": round((time.perf_counter() - t) * 1e3, 1),
            "fwd_p50": round(statistics.median(fw), 2), "slow_fwds": sum(v > 20 for v in fw), "fwds": len(fw)}
        print(phase, spec, res[f"engine_cudnn_{phase}_spec_{spec}"], flush=True)
json.dump(res, open(f"{OUT}/probe_cudnn_attention.json", "w"), indent=1)
