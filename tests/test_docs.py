"""The README is a user's page and docs/ holds the rest; both must point at things that exist.

Files move (the package was just split into layers) and sections move between pages, and a link or a
path in prose does not break anything that runs, so nothing else would notice. These tests read the
Markdown only: no server, no model.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# A newcomer reads it in ten minutes (issue #29); the research log lives in docs/.
README_MAX_LINES = 300
# Folders a path in prose may start from; the layer packages are also named without the
# `codespec_lsp/` prefix (`engine/kvcache.py`).
ROOTS = ("codespec_lsp/", "scripts/", "benchmarks/", "docs/", "editors/", "tests/", "examples/")
PACKAGES = ("lsp/", "completion/", "engine/", "remote/", "planning/", "bench/", "models/")
LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`\s]+)`")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    anchors, fenced = set(), False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            anchors.add(_slug(line.lstrip("#")))
    return anchors


def _prose(page: Path) -> str:
    """The page without its fenced blocks: commands there name the user's files, not ours."""
    return re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)


def test_readme_is_one_page() -> None:
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines < README_MAX_LINES, f"README.md has {lines} lines; move detail to docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_links_reach_a_file_and_heading(page: Path) -> None:
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(target)
    assert not broken, f"{page.name}: links to nothing: {broken}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_paths_in_prose_exist(page: Path) -> None:
    missing = []
    for text in CODE.findall(_prose(page)):
        path = text.rstrip(".,:;")
        if any(c in path for c in "{}*…<>") or "/" not in path:
            continue
        if path.startswith(ROOTS):
            found = (ROOT / path).exists()
        elif path.startswith(PACKAGES):
            found = (ROOT / "codespec_lsp" / path).exists()
        else:
            continue
        if not found:
            missing.append(path)
    assert not missing, f"{page.name}: no such file or folder: {missing}"
