"""Measure a preset's scoring knobs (engine/scoring.py) with `bench quality`'s scorer: pick on a
tuning corpus, check the pick on a corpus never tuned on, write one JSON.

    python scripts/tune_scoring.py --preset smol --points 64 \
        --json benchmarks/results/scoring_smol_cpu.json

Configurations: the copy prior's weight x the name lean on/off, each scored with a sweep of
minConfidence values from the same generations (finalize is pure). The pick maximises prefix
characters kept at line starts plus mid-line (what word-by-word accept keeps), then similarity.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from codespec_lsp.bench.quality import quality_bench
from codespec_lsp.engine import load_engine
from codespec_lsp.engine.scoring import SCORING, Scoring

ROOT = Path(__file__).resolve().parent.parent
SWEEP = (0.0, 0.01, 0.02, 0.05, 0.1)


def run(engine, scoring: Scoring, corpus: Path, points: int) -> dict:
    engine.scoring = scoring
    engine.reset_caches()
    t0 = time.perf_counter()
    out = quality_bench(engine, corpus=corpus, points=points, sweep=SWEEP)
    out["seconds"] = round(time.perf_counter() - t0, 1)
    out["scoring"] = dataclasses.asdict(scoring)
    print(json.dumps({k: out[k] for k in ("scoring", "prefix_match_chars", "edit_similarity",
                                          "exact_line", "shown_rate", "seconds")}), flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="smol")
    ap.add_argument("--points", type=int, default=64)
    ap.add_argument("--tune", default=str(ROOT / "benchmarks" / "unseen_tune"))
    ap.add_argument("--check", default=str(ROOT / "benchmarks" / "unseen_check"))
    ap.add_argument("--weights", default="0,0.25,0.5")
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    engine = load_engine(preset=args.preset, device="cpu")
    configs = [Scoring(copy_weight=float(w)) for w in args.weights.split(",")]
    configs.append(Scoring(copy_weight=0.0, word_bias=10.0))
    report = {"preset": args.preset, "points": args.points, "tune": args.tune,
              "check": args.check, "sweep": SWEEP, "tuning": []}
    for scoring in configs:
        report["tuning"].append(run(engine, scoring, Path(args.tune), args.points))
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    # The pick: copy weight and lean from the full runs; the gate from the sweep of that run.
    best = max(report["tuning"], key=lambda r: (r["prefix_match_chars"], r["edit_similarity"]))
    gate = max(SWEEP, key=lambda t: (best["sweep"][str(t)]["prefix_match_chars"],
                                     best["sweep"][str(t)]["edit_similarity"]))
    picked = Scoring(**{**best["scoring"], "min_confidence": gate})
    report["picked"] = dataclasses.asdict(picked)
    old = SCORING.get("tiny")  # the values tuned on the tiny pair, as the product ran before
    report["check_picked"] = run(engine, picked, Path(args.check), args.points)
    report["check_tiny_values"] = run(engine, dataclasses.replace(old, measured=""), Path(args.check),
                                      args.points)
    Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
