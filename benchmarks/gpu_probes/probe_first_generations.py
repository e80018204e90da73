"""H200 probe 3 of 5: per-forward times of 200-token generations, fp16 against fp32, to see where
the slow fp16 forwards of probe 2 come from (none were NaN, none re-prefilled)."""
import json, math, os, statistics, sys, time
import torch
from codespec_lsp.engine import load_engine
from codespec_lsp.bench.engine import engine as bench
OUT = os.environ.get("OUT", "gpu_out")
dev = os.environ.get("DEV", "cuda")
res = {}
for dtype in ("float16", "float32"):
    eng = load_engine(preset="tiny", device=dev, dtype=dtype)
    prompts = bench.completion_points(bench.corpus_files(None), 24, eng)
    bench._gen(eng, prompts[0], max_new_tokens=8)
    rows = []
    for i in range(4):
        key = f"p{i}"
        bench._prefill(eng, prompts[i], key)
        for spec in (True, False):
            eng.target_forward_s.clear()
            t = time.perf_counter()
            r = bench._gen(eng, prompts[i], max_new_tokens=200, key=key, speculative=spec)
            wall = (time.perf_counter() - t) * 1e3
            fw = [v * 1e3 for v in eng.target_forward_s]
            rows.append({"i": i, "spec": spec, "wall_ms": round(wall, 1), "tokens": len(r.tokens),
                         "prefill_tokens": r.prefill_tokens, "stop": r.stop_reason,
                         "nan_logprobs": sum(1 for lp in r.logprobs if not math.isfinite(lp)),
                         "fwds": len(fw), "fwd_first5": [round(v, 1) for v in fw[:5]],
                         "fwd_last5": [round(v, 1) for v in fw[-5:]], "fwd_max": round(max(fw, default=0), 1),
                         "prompt_tokens": eng.count_tokens(prompts[i])})
            print(dtype, rows[-1], flush=True)
    res[dtype] = rows
json.dump(res, open(f"{OUT}/probe_first_generations.json", "w"), indent=1)
