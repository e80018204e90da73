"""`codespec-lsp bench quality`: how good the shown suggestions are, on held-out Python.

Completion points are drawn (seeded) from held-out files, half at a line start after its
indentation and half mid-line (at least one character typed on the line, at least one left), and
answered by `complete.complete_at` with the server's default settings: what an editor is shown.
The document it is asked on is the file as it stood while that line was being typed: the rest of
the cursor's line is not there yet (lines below are). Left in place, the real rest of the line
would sit right of the cursor, and a suggestion that typed it would be dropped for re-typing the
suffix, as an editor must: the bench would score the server for the one answer it may not give.
Each suggestion is scored against the code that really follows the cursor.

Fields (the README quotes these):
  points                          completion points asked
  shown_rate                      share of points with a suggestion shown
  exact_line                      the suggestion's first line equals the rest of the real line
  edit_similarity                 mean difflib ratio of first line vs rest of the real line, over
                                  all points (0 where nothing is shown)
  repetitive_rate                 share of shown suggestions with a loop (postprocess.find_loop:
                                  a word or character group repeated, the same line repeated)
  prefix_match_chars              mean common prefix of suggestion and real text, in characters,
                                  over all points: what word-by-word accept keeps
  baseline_prev_line_similarity   the edit_similarity of "the line repeats the previous non-blank
                                  line" (re-indented to the cursor's line; from the cursor's column)

"by_kind" holds the same fields for the line-start and the mid-line points apart.
`--sweep P1,P2,...` adds "sweep": the same fields per minConfidence value, from the same
generations (the finalize call complete_at made, re-run with another threshold). The default
threshold was picked this way on benchmarks/corpus, never on benchmarks/heldout.
"""

from __future__ import annotations

import difflib
import json
import os
import random
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from codespec_lsp.completion import complete
from codespec_lsp.completion import postprocess
from codespec_lsp.completion.complete import complete_at, split_line
from codespec_lsp.config import Settings, default_context_tokens
from codespec_lsp.completion.context import ContextBuilder
from codespec_lsp.completion.postprocess import find_loop

HELD_OUT = Path(__file__).resolve().parent.parent.parent / "benchmarks" / "heldout"
FIELDS = ("points", "shown_rate", "exact_line", "edit_similarity", "repetitive_rate",
          "prefix_match_chars", "baseline_prev_line_similarity")


@dataclass(frozen=True)
class Point:
    path: str
    source: str
    offset: int
    kind: str  # "line_start" | "mid_line"

    @property
    def document(self) -> str:
        """The file while the cursor's line is being typed: that line ends at the cursor."""
        end = self.source.find("\n", self.offset)
        return self.source[:self.offset] + (self.source[end:] if end != -1 else "")


def quality_points(files: list[Path], n: int, seed: int = 0, skip_lines: int = 20) -> list[Point]:
    """`n` distinct points, alternately at a line start (after indentation) and mid-line, on
    non-blank lines past the first `skip_lines` of a file (licence headers, imports)."""
    rng = random.Random(seed)
    texts = {str(f): f.read_text(encoding="utf-8") for f in files}
    candidates = []
    for path, text in texts.items():
        offset = 0
        for i, line in enumerate(text.split("\n")):
            code = line.rstrip()
            indent = len(code) - len(code.lstrip())
            if i >= skip_lines and code.strip():
                candidates.append((path, offset, indent, len(code)))
            offset += len(line) + 1
    rng.shuffle(candidates)
    points = []
    for path, start, indent, end in candidates[:n]:
        if len(points) % 2 == 0 or end - indent < 2:
            points.append(Point(path, texts[path], start + indent, "line_start"))
        else:
            at = start + rng.randrange(indent + 1, end)
            points.append(Point(path, texts[path], at, "mid_line"))
    return points


def baseline_text(source: str, offset: int) -> str:
    """What "the line repeats the previous non-blank line" would insert at the cursor."""
    line_prefix, _, prev_line = split_line(source, offset)
    indent = line_prefix[:len(line_prefix) - len(line_prefix.lstrip())]
    return (indent + prev_line.strip())[len(line_prefix):]


def score(point: Point, suggestion: str | None) -> dict:
    rest = point.source[point.offset:]
    real_line = rest.split("\n", 1)[0].rstrip()
    first = suggestion.split("\n", 1)[0].rstrip() if suggestion else ""
    baseline = baseline_text(point.source, point.offset)
    line_prefix = split_line(point.source, point.offset)[0]
    return {
        "shown": suggestion is not None,
        "exact": suggestion is not None and first == real_line,
        "similarity": (difflib.SequenceMatcher(None, first, real_line).ratio()
                       if suggestion else 0.0),
        "repetitive": suggestion is not None and find_loop(suggestion, line_prefix) is not None,
        "prefix": len(os.path.commonprefix([suggestion, rest])) if suggestion else 0,
        "baseline": difflib.SequenceMatcher(None, baseline.rstrip(), real_line).ratio(),
    }


def summarize(scores: list[dict]) -> dict:
    n = len(scores)
    shown = [s for s in scores if s["shown"]]

    def mean(key: str, over: list[dict]) -> float:
        return sum(float(s[key]) for s in over) / len(over) if over else 0.0
    return {
        "points": n,
        "shown_rate": round(len(shown) / n, 4) if n else 0.0,
        "exact_line": round(mean("exact", scores), 4),
        "edit_similarity": round(mean("similarity", scores), 4),
        "repetitive_rate": round(mean("repetitive", shown), 4),
        "prefix_match_chars": round(mean("prefix", scores), 2),
        "baseline_prev_line_similarity": round(mean("baseline", scores), 4),
    }


@contextmanager
def _finalize_calls():
    """Record the arguments complete_at passes to postprocess.finalize (whatever it did to the
    prompt and text before, token healing included), so a sweep re-runs exactly that call."""
    calls: list[tuple[tuple, dict]] = []

    def recording(*args, **kwargs):
        calls.append((args, kwargs))
        return postprocess.finalize(*args, **kwargs)
    saved = complete.finalize
    complete.finalize = recording
    try:
        yield calls
    finally:
        complete.finalize = saved


def quality_bench(engine, corpus: str | Path | None = None, points: int = 40, seed: int = 0,
                  min_confidence: float | None = None, sweep: tuple[float, ...] = (),
                  copy_weight: float | None = None, exact: bool = False,
                  workspace_root: bool = False, workspace_context: bool | None = None) -> dict:
    """The FIELDS for `points` points; with `sweep`, also the same figures per threshold (under
    "sweep", computed from the same generations: finalize is pure, only the gate differs).
    `workspace_root`: the corpus folder is the editor's workspace, so the workspace context may
    read the corpus's other files (never the asked file's saved text: it holds the answer);
    `workspace_context`: that setting, None for the server's default."""
    root = (Path(corpus) if corpus else HELD_OUT).resolve()
    files = sorted(root.rglob("*.py"))
    if not files:
        raise SystemExit(f"no .py files under {root}")
    settings = Settings()
    builder = ContextBuilder(engine.count_tokens,
                             default_context_tokens(engine.context_window, settings.max_tokens),
                             fim_tokens=engine.fim_tokens,
                             workspace_context=settings.workspace_context
                             if workspace_context is None else workspace_context)
    roots = [root.as_uri()] if workspace_root else []
    scores, swept = [], {t: [] for t in sweep}
    chosen = quality_points(files, points, seed)
    for point in chosen:
        key = Path(point.path).resolve().as_uri()
        with _finalize_calls() as calls:
            result, text = complete_at(engine, builder, key, point.document, point.offset,
                                       max_tokens=settings.max_tokens,
                                       min_confidence=min_confidence, copy_weight=copy_weight,
                                       exact=exact, roots=roots)
        builder.forget(key)  # a fresh document per point: no prompt cut carried over
        scores.append(score(point, text))
        for t in sweep:
            # finalize is pure: the same call with another threshold is what that setting shows
            again = None
            for args, kwargs in calls[-1:]:
                again = postprocess.finalize(*args, **{**kwargs, "min_confidence": t})
            swept[t].append(score(point, again))
    out = summarize(scores)
    # Line starts and mid-line points differ in kind (a new line vs the rest of a typed one).
    out["by_kind"] = {kind: summarize([s for s, p in zip(scores, chosen) if p.kind == kind])
                      for kind in ("line_start", "mid_line")}
    if sweep:
        out["sweep"] = {str(t): summarize(s) for t, s in swept.items()}
    return out


def run_quality_bench(args) -> int:
    from codespec_lsp.engine import load_engine
    engine = load_engine(preset=args.preset, draft=args.draft, target=args.target,
                         device=args.device, dtype=args.dtype, allow_download=args.allow_download,
                         trust_remote_code=args.trust_remote_code)
    sweep = tuple(float(t) for t in args.sweep.split(",")) if args.sweep else ()
    result = quality_bench(engine, corpus=args.corpus, points=args.points,
                           min_confidence=args.min_confidence, sweep=sweep,
                           copy_weight=args.copy_weight, exact=getattr(args, "exact", False),
                           workspace_root=args.workspace_root,
                           workspace_context=None if args.workspace_context is None
                           else args.workspace_context == "true")
    out = json.dumps(result, indent=2)
    if args.json_path:
        Path(args.json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_path).write_text(out + "\n")
    print(out)
    return 0
