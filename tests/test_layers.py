"""The package tree is the architecture: imports flow down the layers only.

Layers, highest first (a module may import its own layer and any layer below it, never one above):

    cli          the `codespec-lsp` entry point: may import everything, nothing imports it
    lsp          the language server: handlers, transport, protocol hardening, documents, scheduler
    planning     planner, doctor, catalog: the server asks the planner about a pair at load
    bench        engine, quality and server benchmarks (the doctor runs bench.engine's measurement)
    completion   prompt building, token healing, the one completion pipeline, post-processing
    remote       the OpenAI-compatible backend (it reads the seam, engine/api.py, and loads tokenizers
                 through engine.models, so it sits above the engine; the engine never imports it)
    engine       the in-process backend and the seam both backends implement (engine/api.py)
    base         config.py, stats.py and the package root: plain data and helpers every layer uses

Every import statement counts, those inside functions too (lazy imports still bind the layers).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import codespec_lsp

PACKAGE = Path(codespec_lsp.__file__).parent
ORDER = ("base", "engine", "remote", "completion", "bench", "planning", "lsp", "cli")
BASE = {"config", "stats", ""}


def layer_of(module: str) -> str:
    """The layer of a dotted module name inside codespec_lsp."""
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else ""
    if top in BASE:
        return "base"
    if top not in ORDER:
        raise AssertionError(f"{module}: no layer is declared for codespec_lsp.{top} (add it to ORDER)")
    return top


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> list[tuple[int, str]]:
    """(line, dotted module) for each codespec_lsp module `path` imports, lazy imports included."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from codespec_lsp import config` imports the module codespec_lsp.config
            found += [(node.lineno, f"{base}.{a.name}" if (PACKAGE.parent / base.replace(".", "/") / a.name).exists()
                       or (PACKAGE.parent / base.replace(".", "/") / f"{a.name}.py").exists() else base)
                      for a in node.names]
    return sorted({(line, m) for line, m in found if m == "codespec_lsp" or m.startswith("codespec_lsp.")})


def upward_imports() -> list[str]:
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        here = module_name(path)
        mine = ORDER.index(layer_of(here))
        for line, target in imported(path):
            theirs = ORDER.index(layer_of(target))
            if theirs > mine:
                problems.append(f"{path.relative_to(PACKAGE.parent)}:{line} ({layer_of(here)}) imports "
                                f"{target} ({layer_of(target)})")
    return problems


def test_no_module_imports_from_a_layer_above_it():
    assert upward_imports() == []


def test_every_module_has_a_layer():
    """A new top-level module or package must be placed in ORDER, not slip past the check."""
    for path in PACKAGE.rglob("*.py"):
        layer_of(module_name(path))


def test_the_check_sees_an_upward_import(tmp_path, monkeypatch):
    """The walker finds lazy and `from package import module` imports (so the check can fail)."""
    fake = tmp_path / "codespec_lsp"
    (fake / "engine").mkdir(parents=True)
    (fake / "completion").mkdir()
    (fake / "completion" / "heal.py").write_text("")
    (fake / "engine" / "x.py").write_text("def f():\n    from codespec_lsp.completion import heal\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)
    assert upward_imports() == ["codespec_lsp/engine/x.py:2 (engine) imports codespec_lsp.completion.heal "
                                "(completion)"]


MAX_FUNCTION_LINES, MAX_CLASS_LINES = 80, 250


def oversized() -> list[str]:
    """Every function over 80 lines and class over 250 in the whole package (issue 29)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            limit = (MAX_CLASS_LINES if isinstance(node, ast.ClassDef) else MAX_FUNCTION_LINES
                     if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None)
            if limit is not None and node.end_lineno - node.lineno + 1 > limit:
                found.append(f"{path.relative_to(PACKAGE.parent)}: {node.name} "
                             f"{node.end_lineno - node.lineno + 1} lines (limit {limit})")
    return found


def test_functions_and_classes_stay_small():
    assert oversized() == []
