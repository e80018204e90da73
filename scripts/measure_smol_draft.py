"""Measure self-speculation drafts for the smol target: greedy agreement and cost per draft token.

    OMP_NUM_THREADS=1 python scripts/measure_smol_draft.py --threads 1 \
        --json benchmarks/results/smol_draft_candidates_cpu.json

A candidate is the target's first L layers + its final norm + its (tied) LM head, optionally with
the head cut to the N ids most frequent in code that is not a test set (benchmarks/corpus and
benchmarks/heldout). Agreement (alpha) is teacher-forced on benchmarks/unseen_tune: the share of
positions where the candidate's argmax equals the full target's argmax. Cost is measured with the
same thread count, interleaved with the target's own 1-token and (K+1)-token forwards at the same
cached context, so the ratios come from one run on a shared machine. The expected speedup applies
engine/speedup.py's best_k to alpha, the cost ratio c and the measured verify costs.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from collections import Counter
from pathlib import Path

import torch

from codespec_lsp.engine import fetch, hf
from codespec_lsp.engine.models import load_model, load_tokenizer
from codespec_lsp.engine.speedup import best_k, expected_tokens

ROOT = Path(__file__).resolve().parent.parent


def code_ids(tokenizer, roots: list[Path]) -> list[list[int]]:
    """Each .py file under `roots` as ids after a BOS, as the engine encodes a prompt."""
    files = sorted(p for root in roots for p in root.rglob("*.py"))
    bos = tokenizer.bos_token_id
    return [[bos] + tokenizer.encode(f.read_text(encoding="utf-8"), add_special_tokens=False)
            for f in files]


def top_ids(docs: list[list[int]], n: int) -> torch.Tensor:
    """The n ids most frequent in `docs`, most frequent first."""
    counts = Counter(i for doc in docs for i in doc)
    return torch.tensor([i for i, _ in counts.most_common(n)], dtype=torch.long)


@torch.inference_mode()
def agreement(model, docs: list[list[int]], layers: list[int], heads: dict[str, torch.Tensor | None],
              window: int, max_windows: int, extra: dict | None = None) -> dict:
    """{f"L{l}/{head}": share of positions whose argmax equals the target's}, plus `extra`
    candidates (name -> callable(hidden_states) -> logits) on the same positions."""
    norm, head_w = model.model.norm, model.lm_head.weight
    agree: Counter = Counter()
    total = 0
    windows = [doc[s:s + window] for doc in docs for s in range(0, len(doc) - 1, window)]
    for ids in windows[:max_windows]:
        out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
        target = out.logits[0].argmax(-1)
        total += len(ids)
        for layer in layers:
            h = norm(out.hidden_states[layer][0])
            for name, subset in heads.items():
                w = head_w if subset is None else head_w[subset]
                pick = (h @ w.T).argmax(-1)
                pick = pick if subset is None else subset[pick]
                agree[f"L{layer}/{name}"] += int((pick == target).sum())
        for name, fn in (extra or {}).items():
            agree[name] += int((fn(out.hidden_states) == target).sum())
    return {"positions": total, **{k: round(v / total, 4) for k, v in sorted(agree.items())}}


def truncated(model, layers: int, subset: torch.Tensor | None):
    """A model of the target's first `layers` layers, its norm and its head (cut to `subset`)."""
    draft = copy.deepcopy(model)
    draft.model.layers = draft.model.layers[:layers]
    draft.config.num_hidden_layers = layers
    if subset is not None:
        head = torch.nn.Linear(draft.config.hidden_size, len(subset), bias=False)
        head.weight = torch.nn.Parameter(model.lm_head.weight[subset].detach().clone())
        draft.lm_head = head
    return draft.eval()


def time_forwards(models: dict[str, object], contexts: list[int], reps: int, feeds: list[int]) -> dict:
    """Median ms per forward, by model and tokens fed, each at each cached context; the models
    take turns rep by rep so a burst from another process hits all of them alike."""
    times: dict[str, list[float]] = {}
    vocab = 49000
    for context in contexts:
        prompt = [1 + (i * 7919) % vocab for i in range(context)]
        caches = {}
        for name, m in models.items():
            caches[name] = hf.new_cache(m)
            hf.prefill(m, prompt, caches[name], 256)
        for rep in range(reps):
            for name, m in models.items():
                for n in (feeds if name == "target" else [1]):
                    t0 = time.perf_counter()
                    hf.forward(m, [5 + (rep + j) % 100 for j in range(n)], caches[name])
                    times.setdefault(f"{name}@{n}", []).append(time.perf_counter() - t0)
                    hf.crop(caches[name], context)
    return {k: round(statistics.median(v) * 1000, 3) for k, v in times.items()}


def break_even(c: float, verify: list[float]) -> float | None:
    """The least agreement (to 0.01) at which some K > 0 beats the target alone; None: none does."""
    return next((a / 100 for a in range(1, 100) if best_k(a / 100, c, 8, verify)[0] > 0), None)


def estimate(alpha: float, c: float, verify: list[float]) -> dict:
    k, speedup = best_k(alpha, c, 8, verify)
    return {"alpha": alpha, "cost_ratio": round(c, 4), "best_k": k, "expected_speedup": round(speedup, 3),
            "tokens_per_forward": round(expected_tokens(alpha, k), 3),
            "break_even_alpha": break_even(c, verify)}


def verify_only(args) -> int:
    """The target's forward time by tokens fed, at each thread count and dtype asked for."""
    torch.set_num_threads(args.threads)
    model = load_model(str(fetch.preset_dir("smol")), device="cpu", dtype=getattr(torch, args.dtype))
    ms = time_forwards({"target": model}, [int(c) for c in args.contexts.split(",")], args.reps,
                       [1, 2, 3, 4, 5, 6])
    result = {"threads": args.threads, "dtype": args.dtype, "contexts": args.contexts, "forward_ms": ms,
              "ratio_to_one": {k: round(v / ms["target@1"], 3) for k, v in ms.items()}}
    print(json.dumps(result))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(result, indent=2) + "\n")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--layers", default="2,4,6,8")
    ap.add_argument("--heads", default="4096,8192")
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--windows", type=int, default=24)
    ap.add_argument("--contexts", default="384,1024")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--verify-only", action="store_true",
                    help="only the target's forward times by tokens fed (the verify costs)")
    ap.add_argument("--json", dest="json_path")
    args = ap.parse_args()
    if args.verify_only:
        return verify_only(args)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    folder = str(fetch.preset_dir("smol"))
    tok = load_tokenizer(folder)
    model = load_model(folder, device="cpu", dtype=torch.float32)
    layers = [int(x) for x in args.layers.split(",")]
    freq_docs = code_ids(tok, [ROOT / "benchmarks/corpus", ROOT / "benchmarks/heldout"])
    heads = {"full": None, **{f"top{n}": top_ids(freq_docs, int(n)) for n in args.heads.split(",")}}
    tune = code_ids(tok, [ROOT / "benchmarks/unseen_tune"])
    t0 = time.perf_counter()
    alphas = agreement(model, tune, layers, heads, args.window, args.windows)
    print(json.dumps(alphas), flush=True)
    agree_s = time.perf_counter() - t0
    feeds = [1, 2, 3, 4, 5, 6]
    models = {"target": model}
    for layer in layers:
        for name, subset in heads.items():
            models[f"L{layer}/{name}"] = truncated(model, layer, subset)
    ms = time_forwards(models, [int(c) for c in args.contexts.split(",")], args.reps, feeds)
    print(json.dumps(ms), flush=True)
    one = ms["target@1"]
    verify = [1.0] + [max(ms[f"target@{n}"] / one, 1.0) for n in feeds[1:]]
    verify += [verify[-1] + (verify[-1] - verify[-2]) * i for i in range(1, 4)]  # K 6..8: linear
    verify = [max(verify[:i + 1]) for i in range(len(verify))]
    candidates = {name: estimate(alphas[name], ms[f"{name}@1"] / one, verify)
                  for name in models if name != "target"}
    result = {"threads": args.threads, "corpus": "benchmarks/unseen_tune",
              "frequency_corpus": "benchmarks/corpus + benchmarks/heldout",
              "window": args.window, "positions": alphas["positions"], "agreement_s": round(agree_s, 1),
              "forward_ms": ms, "verify_cost_by_k": [round(v, 3) for v in verify],
              "candidates": candidates}
    print(json.dumps(result, indent=2))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
