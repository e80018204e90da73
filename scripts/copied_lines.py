"""How often a suggestion repeats, after its first line, a line the file already has above the cursor.

The copy prior (codespec_lsp/engine/copy_prior.py) was first mixed into every token, and then
copied whole lines from above into a suggestion's later lines; it now scores the first line only.
This counts that, at the `bench quality` points (same seed, same pipeline): a later line of the
suggestion that, stripped and longer than MIN_CHARS, equals a line above the cursor. The real code
over as many lines is counted the same way, for scale.

  .venv/bin/python scripts/copied_lines.py [--corpus DIR] [--points 300] [--copy-weight W]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from codespec_lsp.bench.engine import quality as bench_quality
from codespec_lsp.completion.complete import complete_at
from codespec_lsp.config import Settings, default_context_tokens
from codespec_lsp.completion.context import ContextBuilder
from codespec_lsp.engine import load_engine

MIN_CHARS = 12  # shorter lines (`else:`, `return None`) repeat in any code


def repeats_a_line_above(text: str | None, above: set[str]) -> bool:
    later = (text or "").split("\n")[1:]
    return any(len(line.strip()) > MIN_CHARS and line.strip() in above for line in later)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", default=None, help="folder of .py files (default: benchmarks/heldout)")
    ap.add_argument("--points", type=int, default=300)
    ap.add_argument("--copy-weight", type=float, default=None, help="default: the server's")
    args = ap.parse_args()
    engine = load_engine(preset="tiny", device="cpu")
    settings = Settings()
    builder = ContextBuilder(engine.count_tokens,
                             default_context_tokens(engine.context_window, settings.max_tokens),
                             fim_tokens=engine.fim_tokens)
    files = sorted(Path(args.corpus or bench_quality.HELD_OUT).rglob("*.py"))
    suggested = real = 0
    for i, point in enumerate(bench_quality.quality_points(files, args.points)):
        _, text = complete_at(engine, builder, f"{point.path}#{i}", point.document, point.offset,
                              max_tokens=settings.max_tokens, copy_weight=args.copy_weight)
        above = {line.strip() for line in point.source[:point.offset].split("\n")}
        lines = len((text or "").split("\n"))
        suggested += repeats_a_line_above(text, above)
        real += repeats_a_line_above("\n".join(point.source[point.offset:].split("\n")[:lines]), above)
    print(json.dumps({"points": args.points, "suggestions_repeating_a_line_above": suggested,
                      "real_code_over_the_same_lines": real}))


if __name__ == "__main__":
    main()
