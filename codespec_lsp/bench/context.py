"""`codespec-lsp bench context`: what workspace context gains, CrossCodeEval-style.

Points are lines of a package that use a name the file imports from a sibling module
(`from .models import Config` ... `cfg = Config(...)`) or an attribute of a sibling module it
imports whole (`from . import store` ... `store.save(x)`), the cursor after the line's indentation.
Each is asked through `complete.complete_at`, what an editor gets, as an editor would: the file
as it stood while that line was typed (the rest of the line not there yet), the other modules of
the package open, the package folder the workspace root; once with `workspaceContext` and once
without, each point a fresh document (no cut carried over).

Fields, for each of "with_context" and "without_context":
  points              completion points asked
  exact_line          the suggestion's first line equals the rest of the real line
  edit_similarity     mean difflib ratio of first line vs rest of the real line (0: nothing shown)
  prefix_match_chars  mean common prefix of suggestion and real text, in characters
  name_hit            the suggestion's first line uses the imported name the real line uses
  prefill_tokens_per_keystroke  prompt tokens run per character typed after a point
  keystroke_ms_p50    median ms from such a character to a 4-token suggestion (complete_at, the
                      pipeline an editor's request runs, without the server's debounce)
"""

from __future__ import annotations

import json
import random
import re
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from codespec_lsp.bench.quality import Point, score
from codespec_lsp.completion.complete import complete_at
from codespec_lsp.completion.context import ContextBuilder
from codespec_lsp.completion.workspace import imported_modules, imported_names, resolve_module
from codespec_lsp.config import Settings, default_context_tokens

SAMPLE = Path(__file__).resolve().parent.parent.parent / "benchmarks" / "context" / "sample"
FIELDS = ("points", "exact_line", "edit_similarity", "prefix_match_chars", "name_hit")
MAX_FILE_CHARS = 200_000


@dataclass(frozen=True)
class ContextPoint:
    point: Point
    names: tuple[str, ...]  # the imported names the real line uses (`name` or `module.attr`)


def _in_package(level: int, module: str, path: Path, package: Path) -> Path | None:
    found = [c for c in resolve_module(level, module, path, (package,))
             if c.is_file() and c.is_relative_to(package)]
    return found[0] if found else None


def siblings(path: Path, text: str, package: Path) -> tuple[set[str], set[str], list[Path]]:
    """(names `text` imports from modules of the package, not installed ones; the names it
    reaches package modules by, read as `module.attr`; the files of those modules)."""
    names, modules, files = set(), set(), []
    for level, module, imported in imported_names(text):
        for name in imported:
            sub = _in_package(level, f"{module}.{name}" if module else name, path, package)
            if sub is not None:  # `from pkg import module`
                modules.add(name)
                files.append(sub)
            elif (found := _in_package(level, module, path, package)) is not None:
                names.add(name)
                files.append(found)
    for module, alias in imported_modules(text):
        if (found := _in_package(0, module, path, package)) is not None:
            modules.add(alias)
            files.append(found)
    return names, modules, list(dict.fromkeys(f for f in files if f != path))


def _uses(names: set[str], modules: set[str]) -> re.Pattern:
    alternatives = [re.escape(m) + r"\.\w+" for m in sorted(modules)]
    alternatives += [re.escape(n) for n in sorted(names)]
    return re.compile(r"(?<![\w.])(" + "|".join(alternatives) + r")(?!\w)")


def context_points(package: Path, n: int, seed: int = 0) -> list[ContextPoint]:
    """`n` points (seeded), at most a third from one file, so one big module does not decide."""
    rng = random.Random(seed)
    by_file: list[list[ContextPoint]] = []
    for path in sorted(package.rglob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        if len(text) > MAX_FILE_CHARS:
            continue
        names, modules = siblings(path, text, package)[:2]
        if not names and not modules:
            continue
        word = _uses(names, modules)
        import_spans = [m.span() for m in re.finditer(r"^[ \t]*(from|import)[ \t][^\n(]*(\([^)]*\))?",
                                                        text, re.M)]
        found, offset = [], 0
        for line in text.split("\n"):
            code = line.strip()
            indent = len(line) - len(line.lstrip())
            at = offset + indent
            used = tuple(dict.fromkeys(word.findall(line)))
            if (used and code and not code.startswith(("#", "from ", "import ", "@", '"', "'"))
                    and not any(a <= at < b for a, b in import_spans)):
                found.append(ContextPoint(Point(str(path), text, at, "line_start"), used))
            offset += len(line) + 1
        rng.shuffle(found)
        if found:
            by_file.append(found)
    rng.shuffle(by_file)
    cap = max(n // 3, 1)
    picked = [p for pts in by_file for p in pts[:cap]]
    rng.shuffle(picked)
    return picked[:n]


def _name_hit(cp: ContextPoint, suggestion: str | None) -> bool:
    first = (suggestion or "").split("\n", 1)[0]
    return any(re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", first) for name in cp.names)


def summarize(rows: list[dict]) -> dict:
    n = len(rows)

    def mean(key: str) -> float:
        return sum(float(r[key]) for r in rows) / n if n else 0.0
    return {"points": n, "exact_line": round(mean("exact"), 4),
            "edit_similarity": round(mean("similarity"), 4),
            "prefix_match_chars": round(mean("prefix"), 2), "name_hit": round(mean("name_hit"), 4)}


# The two runs `bench context` reports: the server's defaults with the setting on and off.
DEFAULT_VARIANTS = {"with_context": {"workspace_context": True},
                    "without_context": {"workspace_context": False}}
KEYSTROKE_POINTS = 8   # points where the real line is then typed, a character at a time
KEYSTROKES = 4


def _typed(engine, builder: ContextBuilder, cp: ContextPoint, ask) -> list[tuple[int, float]]:
    """(prompt tokens the model ran, ms to a 4-token suggestion) for each of KEYSTROKES characters
    of the real line, typed after the first completion (the KV cache is what makes each few)."""
    line = cp.point.source[cp.point.offset:].split("\n", 1)[0]
    typed = []
    for i in range(1, min(KEYSTROKES, len(line)) + 1):
        at = cp.point.offset + i
        started = time.perf_counter()
        result, _ = ask(cp.point.source[:at] + cp.point.document[cp.point.offset:], at, 4)
        typed.append((result.prefill_tokens, (time.perf_counter() - started) * 1000))
    return typed


def context_bench(engine, package: str | Path | None = None, points: int = 40, seed: int = 0,
                  copy_weight: float | None = None, variants: dict[str, dict] | None = None,
                  keystroke_points: int = KEYSTROKE_POINTS) -> dict:
    """The FIELDS for each variant (ContextBuilder settings; by default with and without
    workspace context) on the same points, and each variant's prefill_tokens_per_keystroke and
    keystroke_ms_p50 over `keystroke_points` points."""
    root = Path(package).resolve() if package else SAMPLE
    pts = context_points(root, points, seed)
    if not pts:
        raise SystemExit(f"no line under {root} uses a name imported from a sibling module")
    settings = Settings()
    budget = default_context_tokens(engine.context_window, settings.max_tokens)
    out: dict = {"package": str(root), "seed": seed, "budget_tokens": budget}
    variants = variants or DEFAULT_VARIANTS
    builders = {label: ContextBuilder(engine.count_tokens, budget, fim_tokens=engine.fim_tokens, **options)
                for label, options in variants.items()}
    rows: dict[str, list[dict]] = {label: [] for label in variants}
    typed: dict[str, list[tuple[int, float]]] = {label: [] for label in variants}
    for i, cp in enumerate(pts):
        key, path = Path(cp.point.path).as_uri(), Path(cp.point.path)
        # The modules the file imports from are the ones open beside it (the server sends
        # at most 8 other documents).
        others = [(f.as_uri(), f.read_text(encoding="utf-8", errors="replace"))
                  for f in siblings(path, cp.point.source, root)[2]][:8]
        # Variants take turns at each point, in alternating order: a shared machine's slow
        # spells then hit every variant alike (variant after variant, one read 60 % slower).
        order = list(variants) if i % 2 == 0 else list(reversed(variants))
        for label in order:
            builder = builders[label]

            def ask(document: str, offset: int, max_tokens: int = settings.max_tokens):
                return complete_at(engine, builder, key, document, offset, max_tokens=max_tokens,
                                   others=others, roots=[root.as_uri()], copy_weight=copy_weight)
            _, text = ask(cp.point.document, cp.point.offset)
            rows[label].append({**score(cp.point, text), "name_hit": _name_hit(cp, text)})
            if i < keystroke_points:
                typed[label] += _typed(engine, builder, cp, ask)
            builder.forget(key)  # a fresh document per point: no cut carried over
            print(f"{label} {i + 1}/{len(pts)} {rows[label][-1]}", file=sys.stderr, flush=True)
    for label in variants:
        out[label] = summarize(rows[label])
        if typed[label]:
            out[label]["prefill_tokens_per_keystroke"] = round(statistics.mean(t for t, _ in typed[label]), 2)
            out[label]["keystroke_ms_p50"] = round(statistics.median(ms for _, ms in typed[label]), 1)
    return out


def run_context_bench(args) -> int:
    from codespec_lsp.engine import load_engine
    engine = load_engine(preset=args.preset, draft=args.draft, target=args.target,
                         device=args.device, dtype=args.dtype, allow_download=args.allow_download,
                         trust_remote_code=args.trust_remote_code)
    result = context_bench(engine, package=args.package, points=args.points,
                           copy_weight=args.copy_weight)
    text = json.dumps(result, indent=2)
    if args.json_path:
        Path(args.json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_path).write_text(text + "\n")
    print(text)
    return 0
