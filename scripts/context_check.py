"""Does a pair hold up over the whole prompt the server gives it? The figures in docs/training.md
for the embedded pair's context (why it was trained on 2048-token windows from phase 6 on) come
from here.

    .venv/bin/python scripts/context_check.py [--pair DIR] [--quality-windows 600,800,0]

Prints one JSON object:
  loss_by_position   the target's mean cross-entropy on 4 seeded 2048-token training windows, per
                     512-position band (a model trained on shorter windows climbs past them)
  accuracy           teacher-forced greedy next-token accuracy on benchmarks/corpus and
                     benchmarks/heldout, over 512- and 1,536-token windows (bench.next_token_accuracy)
  quality            `bench quality` (100 points, benchmarks/heldout) with the model's window
                     declared as N (prefix budget then default_context_tokens(N): 402 tokens at
                     600, 1,488 at 2,048), 0 = the model's own
The first pair is the folder codespec_lsp/models/tiny at commit 8319c20 (`git archive`).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from codespec_lsp import TINY_DIR
from codespec_lsp.bench.engine import corpus_files, corpus_stream, next_token_accuracy
from codespec_lsp.bench.quality import FIELDS, quality_bench
from codespec_lsp.engine import load_engine

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import train_tiny  # noqa: E402  (the training data and windows, exactly as trained)


def loss_by_position(model, tokenizer, windows: int = 4, seq: int = 2048, band: int = 512) -> dict:
    stream = train_tiny.encode_stream(train_tiny.read_texts(train_tiny.training_files()), tokenizer)
    data = train_tiny.batches(stream, tokenizer.bos_token_id, 1, random.Random(99), seq)
    total = torch.zeros(seq - 1)
    with torch.inference_mode():
        for _ in range(windows):
            x = next(data)
            logits = model(x[:, :-1]).logits
            total += F.cross_entropy(logits.transpose(1, 2), x[:, 1:], reduction="none")[0]
    total /= windows
    return {f"{a}-{a + band}": round(total[a:a + band].mean().item(), 3) for a in range(0, seq - 1, band)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", type=Path, default=TINY_DIR, help="folder with target/ and draft/")
    parser.add_argument("--quality-windows", default="600,800,0")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    engine = load_engine(device="cpu", target=str(args.pair / "target"), draft=str(args.pair / "draft"))
    out = {"loss_by_position": loss_by_position(engine.target_model, engine.tokenizer), "accuracy": {}}
    for name in ("corpus", "heldout"):
        stream = corpus_stream(engine, corpus_files(str(ROOT / "benchmarks" / name)))
        for window, count in ((512, 24), (1536, 8)):
            accuracy, _ = next_token_accuracy(engine, stream, window=window, max_windows=count)
            out["accuracy"][f"{name}_{window}"] = round(accuracy, 4)
    own_window, out["quality"] = engine.context_window, {}
    for window in (int(w) for w in args.quality_windows.split(",")):
        engine.context_window = window or own_window
        result = quality_bench(engine, points=100)
        out["quality"][str(window)] = {k: result[k] for k in FIELDS}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
