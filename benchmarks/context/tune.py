"""Which form of workspace context helps smol: every candidate on the same points of one package.

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/context/tune.py DIR --points 30 --json OUT

The candidates (ContextBuilder settings): off; the definitions of imported names with a class's
fields and method signatures ("members") or signature and first docstring line only
("signatures"); 0.1, 0.25 or 0.4 of the prompt budget; as code under a path comment right before
the file, or every line a comment. One changed at a time from members / 0.25 / code, then from
signatures / 0.25 / code. Later candidates: uses of the names, the definitions near the statement
being written, and windows of other files most like the lines above the cursor (retrieval.py).
Every candidate names its windows (ON has none), so each stays the form it was measured as.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from codespec_lsp.bench.context import context_bench
from codespec_lsp.engine import load_engine

ON = {"workspace_context": True, "context_windows": 0}  # the forms measured before windows
CANDIDATES = {
    "off": {"workspace_context": False},
    "members_0.25_code": {**ON, "context_detail": "members"},
    "signatures_0.25_code": {**ON, "context_detail": "signatures"},
    "members_0.1_code": {**ON, "context_detail": "members", "context_share": 0.1},
    "members_0.4_code": {**ON, "context_detail": "members", "context_share": 0.4},
    "members_0.25_comment": {**ON, "context_detail": "members", "context_form": "comment"},
    # Added after the first package (gepa) put "signatures" ahead: its share and form.
    "signatures_0.1_code": {**ON, "context_detail": "signatures", "context_share": 0.1},
    "signatures_0.4_code": {**ON, "context_detail": "signatures", "context_share": 0.4},
    "signatures_0.25_comment": {**ON, "context_detail": "signatures", "context_form": "comment"},
    "usages_0.25_code": {**ON, "context_detail": "usages"},
    # The definitions right before the top-level statement being written, not before the file.
    "signatures_0.25_near": {**ON, "context_detail": "signatures", "context_place": "near"},
    # Windows of other files (open, or beside the current one) most like the lines above the
    # cursor, after the signatures: how the project writes the calls (retrieval.py).
    "signatures_1window": {**ON, "context_windows": 1, "window_share": 0.15},
    "signatures_2windows": {**ON, "context_windows": 2, "window_share": 0.25},
    # Added after gepa and openai-agents read both window rows above the signatures alone.
    "windows_only_2": {**ON, "context_share": 0.0, "context_windows": 2, "window_share": 0.25},
    "signatures_3windows": {**ON, "context_windows": 3, "window_share": 0.35},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package")
    parser.add_argument("--points", type=int, default=30)
    parser.add_argument("--json", dest="json_path", required=True)
    parser.add_argument("--only", default="", help="comma-separated candidate names")
    parser.add_argument("--preset", default="smol")
    args = parser.parse_args()
    torch.set_num_threads(1)
    chosen = {k: v for k, v in CANDIDATES.items() if not args.only or k in args.only.split(",")}
    engine = load_engine(preset=args.preset, device="cpu")
    result = context_bench(engine, package=args.package, points=args.points, variants=chosen,
                           keystroke_points=0)
    result["preset"] = args.preset
    Path(args.json_path).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
