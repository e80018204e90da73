"""H200 probe 4 of 5: fp32, bf16 and fp16 engines in one process, order rotated each round: are
the slow forwards tied to the dtype, or to what ran first?"""
import json, os, statistics, time
from codespec_lsp.engine import load_engine
from codespec_lsp.bench.engine import engine as bench
OUT = os.environ.get("OUT", "gpu_out")
dev = os.environ.get("DEV", "cuda")
dtypes = ["float32", "bfloat16", "float16"]
engines = {d: load_engine(preset="tiny", device=dev, dtype=d) for d in dtypes}
prompts = bench.completion_points(bench.corpus_files(None), 4, engines["float32"])
for d, eng in engines.items():
    bench._gen(eng, prompts[0], max_new_tokens=8)
    for i in range(2):
        bench._prefill(eng, prompts[i], f"p{i}")
rows, t0 = [], time.perf_counter()
for rnd in range(4):
    order = dtypes[rnd % 3:] + dtypes[:rnd % 3]
    for d in order:
        eng = engines[d]
        for i in range(2):
            for spec in (False, True):
                eng.target_forward_s.clear()
                start = time.perf_counter() - t0
                r = bench._gen(eng, prompts[i], max_new_tokens=200, key=f"p{i}", speculative=spec)
                fw = [v * 1e3 for v in eng.target_forward_s]
                rows.append({"round": rnd, "dtype": d, "i": i, "spec": spec, "start_s": round(start, 2),
                             "wall_ms": round((time.perf_counter() - t0 - start) * 1e3, 1),
                             "fwd_p50": round(statistics.median(fw), 2), "slow_fwds": sum(v > 20 for v in fw),
                             "fwds": len(fw), "fwd_max": round(max(fw), 1)})
                print(rows[-1], flush=True)
summary = {d: {"slow_fraction": round(sum(r["slow_fwds"] for r in rows if r["dtype"] == d)
                                     / sum(r["fwds"] for r in rows if r["dtype"] == d), 4),
               "wall_ms_median": statistics.median(r["wall_ms"] for r in rows if r["dtype"] == d)} for d in dtypes}
print("SUMMARY", summary, flush=True)
json.dump({"rows": rows, "summary": summary}, open(f"{OUT}/probe_dtypes_interleaved.json", "w"), indent=1)
