"""Recently edited spans as context: measured on a repository's history.

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/context/edits.py REPO --under src/gepa \
        --points 60 --json OUT

A package on disk has no edit history; a repository's commits do. A point is a line a commit
added to a file A that uses a name A imports from a sibling module (as `bench context` picks
them), the cursor after its indentation. The other `.py` files that commit changed under
`--under` are the documents edited just before, their added lines (git's hunks) the edited spans,
shown as the server shows them (lsp/documents.py's span_text, at most MAX_EDITED_SPANS, the
last in the diff taken as the latest). The tree at that commit, extracted to a temporary folder,
is the workspace; A's sibling modules are open. Each point is asked three ways through
complete_at, the pipeline an editor's request runs: without context, with the workspace context
as `bench context` has it (no edits), and with the edited spans too (what the server sends).
JSON: bench context's fields for each of without_context, with_context and with_edits
(name_hit is 0 at a point whose line uses no imported name: with --any-line, every added line
of code is a point, to see what the edits cost where they have nothing to give).
"""

from __future__ import annotations

import argparse
import io
import json
import random
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import torch

from codespec_lsp.bench.context import ContextPoint, _name_hit, _uses, siblings, summarize
from codespec_lsp.bench.quality import Point, score
from codespec_lsp.completion.complete import complete_at
from codespec_lsp.completion.context import ContextBuilder
from codespec_lsp.config import Settings, default_context_tokens
from codespec_lsp.engine import load_engine
from codespec_lsp.lsp.documents import MAX_EDITED_SPANS, span_text, split_lines

POINTS_PER_COMMIT = 2
_NOT_CODE = ("#", "from ", "import ", "@", '"', "'")


def git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True,
                          check=True).stdout


def origin(repo: str) -> str:
    """Where the clone came from (its `origin` remote), else its folder's name: a local path in
    a results file names nothing another machine can fetch."""
    try:
        return git(repo, "config", "--get", "remote.origin.url").strip()
    except subprocess.CalledProcessError:  # no origin remote
        return Path(repo).resolve().name


def added_lines(repo: str, commit: str) -> dict[str, list[tuple[int, int]]]:
    """{path: [(first line, count)]} of the lines `commit` added to .py files (1-based)."""
    added: dict[str, list[tuple[int, int]]] = {}
    path = None
    for line in git(repo, "show", "--format=", "-U0", "--no-renames", commit, "--", "*.py").splitlines():
        if line.startswith("+++ "):
            path = line[6:] if line.startswith("+++ b/") else None
        elif line.startswith("@@") and path:
            m = re.match(r"@@ -\S+ \+(\d+)(?:,(\d+))? @@", line)
            start, count = int(m.group(1)), int(m.group(2) or 1)
            if count:
                added.setdefault(path, []).append((start, count))
    return added


def commit_points(repo: str, commit: str, under: str, tree: Path, rng: random.Random,
                  any_line: bool = False):
    """(ContextPoint, open sibling files, edited spans as (path, text)) for up to
    POINTS_PER_COMMIT lines of `commit`; the tree at `commit` is extracted to `tree`.
    `any_line`: every added line of code, not only those using an imported name (what the
    edits cost where they have nothing to give)."""
    added = {p: h for p, h in added_lines(repo, commit).items() if p.startswith(under + "/")}
    if len(added) < 2:
        return []
    data = subprocess.run(["git", "-C", repo, "archive", commit, under], capture_output=True,
                          check=True).stdout
    tarfile.open(fileobj=io.BytesIO(data)).extractall(tree, filter="data")
    root = (tree / under).parent.resolve()
    found = []
    for path, hunks in added.items():
        file = (tree / path).resolve()
        text = file.read_text(encoding="utf-8", errors="replace")
        names, modules, files = siblings(file, text, root)
        edits = [(str((tree / other).resolve()),
                  span_text(split_lines((tree / other).read_text(encoding="utf-8", errors="replace")),
                            start - 1, start + count - 2))
                 for other, other_hunks in added.items() if other != path
                 for start, count in other_hunks][-MAX_EDITED_SPANS:][::-1]
        edits = [(p, t) for p, t in edits if t.strip()]
        if (not names and not modules and not any_line) or not edits:
            continue
        word = _uses(names, modules) if names or modules else None
        lines = text.split("\n")
        starts = [0]
        for line in lines:
            starts.append(starts[-1] + len(line) + 1)
        for start, count in hunks:
            for i in range(start - 1, min(start - 1 + count, len(lines))):
                line, code = lines[i], lines[i].strip()
                used = word.findall(line) if word else []
                if code and not code.startswith(_NOT_CODE) and (used or any_line):
                    at = starts[i] + len(line) - len(line.lstrip())
                    point = ContextPoint(Point(str(file), text, at, "line_start"),
                                         tuple(dict.fromkeys(used)))
                    found.append((point, files, edits, root))
    rng.shuffle(found)
    return found[:POINTS_PER_COMMIT]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("repo", help="a git clone with its history")
    parser.add_argument("--under", required=True, help="the package folder, e.g. src/gepa")
    parser.add_argument("--points", type=int, default=60)
    parser.add_argument("--commits", type=int, default=400, help="the latest N commits drawn from")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", dest="json_path", required=True)
    parser.add_argument("--preset", default="smol")
    parser.add_argument("--origin", help="the URL the JSON names (default: the clone's origin remote)")
    parser.add_argument("--any-line", action="store_true",
                        help="points on any added line of code, not only those using an imported name")
    args = parser.parse_args()
    torch.set_num_threads(1)
    engine = load_engine(preset=args.preset, device="cpu")
    settings = Settings()
    budget = default_context_tokens(engine.context_window, settings.max_tokens)
    variants = {"without_context": False, "with_context": True, "with_edits": True}
    builders = {label: ContextBuilder(engine.count_tokens, budget, fim_tokens=engine.fim_tokens,
                                      workspace_context=on) for label, on in variants.items()}
    rows: dict[str, list[dict]] = {label: [] for label in variants}
    rng = random.Random(args.seed)
    commits = git(args.repo, "log", "--no-merges", "--format=%H", "-n", str(args.commits), "--",
                  args.under).split()
    rng.shuffle(commits)
    out: dict = {"repo": args.origin or origin(args.repo),
                 "head": git(args.repo, "rev-parse", "HEAD").strip(), "under": args.under,
                 "seed": args.seed, "budget_tokens": budget, "preset": args.preset,
                 "any_line": args.any_line}
    with tempfile.TemporaryDirectory() as scratch:
        n = 0
        for commit in commits:
            if n >= args.points:
                break
            for cp, files, edits, root in commit_points(args.repo, commit, args.under,
                                                        Path(scratch) / commit[:12], rng,
                                                        args.any_line):
                if n >= args.points:
                    break
                key = Path(cp.point.path).as_uri()
                others = [(f.as_uri(), f.read_text(encoding="utf-8", errors="replace"))
                          for f in files][:8]
                for label, builder in builders.items():
                    _, text = complete_at(engine, builder, key, cp.point.document, cp.point.offset,
                                          max_tokens=settings.max_tokens, others=others,
                                          roots=[root.as_uri()],
                                          edits=edits if label == "with_edits" else ())
                    rows[label].append({**score(cp.point, text), "name_hit": _name_hit(cp, text)})
                    builder.forget(key)
                n += 1
                print(n, commit[:8], Path(cp.point.path).name,
                      {k: (int(v[-1]["name_hit"]), int(v[-1]["exact"])) for k, v in rows.items()},
                      file=sys.stderr, flush=True)
    for label in variants:
        out[label] = summarize(rows[label])
    Path(args.json_path).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
