#!/usr/bin/env python3
"""Same pair, same prompts, same machine, one run: the in-process engine next to a remote server.

    scripts/serve_vllm.sh &                                  # vLLM serving the embedded pair
    .venv/bin/python scripts/bench_remote_vs_local.py --remote http://127.0.0.1:8000/v1 \
        --json benchmarks/remote_vs_local.json

For each held-out point (~1,000 tokens of code before the cursor): warm every cache on the prompt
without its last character, then time the keystroke that types it (48 new tokens, greedy), for
the in-process engine with speculation, the target alone, and the server. The order rotates per
point so no side always runs first. `same_tokens` counts the points where the server's greedy
ids equal the in-process engine's (lossless across backends).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from codespec_lsp.bench.engine import completion_points, corpus_files  # noqa: E402
from codespec_lsp.engine import load_engine  # noqa: E402
from codespec_lsp.remote import connect_remote  # noqa: E402


def local_ids(engine, text: str, n: int) -> list[int]:
    if hasattr(engine, "encode"):  # the seam
        return engine.encode(text)
    return engine.encode_prompt(text, reserve=n + 9)


def run_local(engine, text: str, n: int, speculative: bool) -> tuple[float, list[int]]:
    start = time.perf_counter()
    if hasattr(engine, "encode"):
        gen = engine.generate(engine.encode(text), max_new_tokens=n, speculative=speculative,
                              key="bench")
        tokens = list(gen)
        gen.close()
    else:
        tokens = engine.generate(text, max_new_tokens=n, speculative=speculative).tokens
    return time.perf_counter() - start, tokens


def run_remote(backend, engine, text: str, n: int) -> tuple[float, list[int]]:
    start = time.perf_counter()
    gen = backend.generate(local_ids(engine, text, n), max_new_tokens=n, key="bench")
    tokens = list(gen)
    gen.close()
    if gen.result.stop_reason == "error":
        raise SystemExit(f"the server failed: {backend.health.message}")
    return time.perf_counter() - start, tokens


def summary(values: list[float]) -> dict:
    ordered = sorted(values)
    return {"median_s": round(statistics.median(ordered), 4),
            "p90_s": round(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], 4),
            "mean_s": round(statistics.fmean(ordered), 4)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--remote", required=True, help="OpenAI-compatible base, e.g. http://127.0.0.1:8000/v1")
    ap.add_argument("--remote-model", default=None)
    ap.add_argument("--api-key-env", default=None)
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--points", type=int, default=16)
    ap.add_argument("--context-tokens", type=int, default=1000)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--json", dest="json_path", default=None)
    args = ap.parse_args(argv)

    engine = load_engine(preset=args.preset, device="cpu")
    backend = connect_remote(args.remote, args.remote_model, args.api_key_env,
                             tokenizer=engine.tokenizer)
    points = completion_points(corpus_files(None), args.points, engine, args.context_tokens)
    n = args.max_tokens
    runs = {
        "local_speculative": lambda t: run_local(engine, t, n, True),
        "local_target_only": lambda t: run_local(engine, t, n, False),
        "remote": lambda t: run_remote(backend, engine, t, n),
    }
    walls: dict[str, list[float]] = {name: [] for name in runs}
    same = 0
    for i, text in enumerate(points):
        names = list(runs)[i % 3:] + list(runs)[:i % 3]
        tokens = {}
        for name in names:
            runs[name](text[:-1])          # warm: the prompt before the keystroke
            wall, tokens[name] = runs[name](text)
            walls[name].append(wall)
        same += tokens["remote"] == tokens["local_speculative"]
        print(f"point {i + 1}/{len(points)}: " + ", ".join(
            f"{name} {walls[name][-1]:.3f} s" for name in runs), file=sys.stderr)
    server = backend.refresh_metrics()
    out = {
        "points": len(points), "max_tokens": n, "context_tokens": args.context_tokens,
        "backend": backend.kind, "remote_url": backend.client.base, "model": backend.client.model,
        **{name: summary(values) for name, values in walls.items()},
        "same_tokens": same,
        "server_acceptance_rate": server.get("server_acceptance_rate"),
        "server_prefix_cache_hit_rate": server.get("server_prefix_cache_hit_rate"),
    }
    backend.close()
    text = json.dumps(out, indent=2)
    print(text)
    if args.json_path:
        Path(args.json_path).write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
