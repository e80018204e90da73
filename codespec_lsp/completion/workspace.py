"""Context beyond the current file: the definitions of the names a file imports from the workspace.

A small model writing `x = load_config(path)` needs `def load_config(path: str) -> Config:` far
more than the text windows most like the lines above (those measured worse than nothing: see
bench/context.py). So the names the file imports with `from M import a, b` are resolved to the
module's file, found first among the open documents, then on disk under the workspace roots, and
each one's header (decorators, signature, first docstring line; for a class also its fields and
method signatures) is put before the file in the prompt. A module imported whole (`import M`,
`import M as m`, `from pkg import module`) gives the attributes the file reads from it
(`m.attr`), then the module's other signatures, one line each.

Promises:
- Disk reads stay inside the workspace roots (a symlink pointing out of them is not followed),
  skip what a `.gitignore` in a root or between it and the file ignores, binary files and files
  over MAX_FILE_BYTES; at most MAX_DISK_FILES files and TIME_BUDGET_S per call.
- Open documents win over disk: an unsaved edit is what the user sees.
- Knows nothing of tokens or LSP types; called once per prompt cut, not per keystroke.
"""

from __future__ import annotations

import ast
import copy
import fnmatch
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence
from urllib.parse import unquote, urlparse

MAX_FILE_BYTES = 512_000
MAX_DISK_FILES = 32
TIME_BUDGET_S = 0.15
REEXPORT_DEPTH = 3      # `from .types import X` where types/__init__.py imports X from elsewhere
MAX_METHODS = 8         # per class: the signatures a call on an instance most likely needs
MAX_FIELDS = 12
MAX_LINE_CHARS = 160
_SKIP_DIRS = {".git", "__pycache__", "node_modules", ".hg", ".svn"}
IMPORT_STATEMENT = re.compile(r"^[ \t]*(?:from[ \t]+(\.*)([\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n#]*)"
                              r"|import[ \t]+([\w. \t,]+))", re.M)


def to_path(name: str) -> Path | None:
    """A document key (file:// URI or plain path) as an absolute path; None for other schemes."""
    if name.startswith("file:"):
        return Path(os.path.normpath(unquote(urlparse(name).path)))
    if re.match(r"^[A-Za-z][\w+.-]*:", name) and not re.match(r"^[A-Za-z]:[\\/]", name):
        return None  # untitled:, vscode-notebook-cell: ... have no place on disk
    return Path(os.path.abspath(name))


def imported_names(source: str) -> list[tuple[int, str, list[str]]]:
    """(level, module, names) of each `from M import names` (relative: level = number of dots).
    Read with a regex, not ast: the file being typed rarely parses."""
    return [(level, module, [name for name, _ in pairs])
            for level, module, pairs in imported_names_as(source)]


def imported_names_as(source: str) -> list[tuple[int, str, list[tuple[str, str]]]]:
    """imported_names with each name's alias: `a as b` is ("a", "b") (the definition is found
    under `a`, the file writes `b`)."""
    out = []
    for m in IMPORT_STATEMENT.finditer(source):
        if m.group(3) is None:
            continue  # `import M`: imported_modules
        names = []
        for part in m.group(3).strip("()").replace("\n", ",").split(","):
            words = part.split("#")[0].split()
            if words and words[0] != "*" and words[0].isidentifier():
                alias = words[2] if len(words) == 3 and words[1] == "as" else words[0]
                names.append((words[0], alias))
        if names:
            out.append((len(m.group(1)), m.group(2), names))
    return out


def imported_modules(source: str) -> list[tuple[str, str]]:
    """(module, the name code reaches it by) of each `import a.b` ("a.b", "a.b") and
    `import a.b as m` ("a.b", "m")."""
    out = []
    for m in IMPORT_STATEMENT.finditer(source):
        for part in (m.group(4) or "").split(","):
            words = part.split()
            if len(words) == 1 and _dotted(words[0]):
                out.append((words[0], words[0]))
            elif len(words) == 3 and words[1] == "as" and _dotted(words[0]) and words[2].isidentifier():
                out.append((words[0], words[2]))
    return out


def _dotted(name: str) -> bool:
    return all(p.isidentifier() for p in name.split("."))


def attributes_used(text: str, alias: str) -> list[str]:
    """The attributes `text` reads from the module known as `alias` (`alias.attr`), each once,
    the one read last first."""
    found = re.findall(rf"(?<![\w.]){re.escape(alias)}\.(\w+)", text)
    return list(dict.fromkeys(reversed(found)))


class GitIgnore:
    """The `.gitignore` patterns of one folder, read the simple way (fnmatch, last match wins,
    `!` re-includes, a trailing `/` matches folders, a `/` inside anchors to the folder)."""

    def __init__(self, folder: Path) -> None:
        self.rules: list[tuple[bool, bool, bool, str]] = []
        try:
            text = (folder / ".gitignore").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return
        for line in text.splitlines():
            line = line.rstrip()
            if not line or line.startswith("#"):
                continue
            negate = line.startswith("!")
            line = line[1:] if negate else line
            folder_only = line.endswith("/")
            line = line.rstrip("/")
            anchored = "/" in line
            self.rules.append((negate, folder_only, anchored, line.lstrip("/")))

    def ignored(self, rel: Sequence[str]) -> bool:
        """`rel`: the parts of a file's path below this folder."""
        verdict = False
        for negate, folder_only, anchored, pattern in self.rules:
            for i in range(len(rel)):
                if folder_only and i == len(rel) - 1:
                    continue
                subject = "/".join(rel[:i + 1]) if anchored else rel[i]
                if fnmatch.fnmatchcase(subject, pattern):
                    verdict = not negate
                    break
        return verdict


@dataclass
class Budget:
    deadline: float
    disk_files: int = 0

    def spent(self) -> bool:
        return self.disk_files >= MAX_DISK_FILES or time.monotonic() > self.deadline


@dataclass
class WorkspaceSource:
    """Module files by path: open documents, else bounded reads under the roots. Parsed modules
    are kept (by path and mtime/size or text) so a re-cut does not parse them again."""

    roots: tuple[Path, ...] = ()
    _ignores: dict[Path, GitIgnore] = field(default_factory=dict)
    _parsed: dict[tuple, "_Module | None"] = field(default_factory=dict)
    _texts: dict[tuple, str] = field(default_factory=dict)  # disk files read, by read()'s key

    def set_roots(self, roots: Iterable[str]) -> None:
        real = tuple(Path(os.path.realpath(p)) for r in roots if (p := to_path(r)) is not None)
        if real != self.roots:
            self.roots, self._ignores = real, {}

    def _root_of(self, path: Path) -> Path | None:
        real = Path(os.path.realpath(path))  # follows links: one out of the roots lands outside
        for root in self.roots:
            if real == root or root in real.parents:
                return root
        return None

    def _ignored(self, root: Path, path: Path) -> bool:
        rel = path.relative_to(root).parts
        if any(part in _SKIP_DIRS for part in rel):
            return True
        folder = root
        for depth in range(len(rel)):
            if folder not in self._ignores:
                self._ignores[folder] = GitIgnore(folder)
            if self._ignores[folder].ignored(rel[depth:]):
                return True
            folder = folder / rel[depth]
        return False

    def module(self, path: Path, open_docs: dict[Path, str], budget: Budget) -> "_Module | None":
        found = self.read(path, open_docs, budget)
        if found is None:
            return None
        key, text = found
        if key not in self._parsed:
            if len(self._parsed) > 256:
                self._parsed.clear()
            self._parsed[key] = _Module.parse(text)
        return self._parsed[key]

    def read(self, path: Path, open_docs: dict[Path, str], budget: Budget
             ) -> tuple[tuple, str] | None:
        """(a key that changes when the text does, the text) of an open document, else of a file
        under the roots within the bounds (the module docstring's promises); None otherwise."""
        if path in open_docs:
            text = open_docs[path]
            return ("open", path, hash(text)), text
        if budget.spent() or not self.allowed(path):
            return None
        try:
            st = path.stat()
            if not path.is_file() or st.st_size > MAX_FILE_BYTES:
                return None
            key = ("disk", path, st.st_mtime_ns, st.st_size)
            if key in self._texts:
                return key, self._texts[key]
            budget.disk_files += 1
            data = path.read_bytes()
        except OSError:
            return None
        if b"\0" in data[:8192]:
            return None  # binary
        if len(self._texts) > 64:  # up to 32 MB of text at MAX_FILE_BYTES
            self._texts.clear()
        self._texts[key] = data.decode("utf-8", errors="replace")
        return key, self._texts[key]

    def allowed(self, path: Path) -> bool:
        """Inside a root (links followed: one pointing out lands outside) and not ignored."""
        root = self._root_of(path)
        abs_path = Path(os.path.abspath(path))
        return root is not None and abs_path.is_relative_to(root) and not self._ignored(root, abs_path)

    def python_files(self, folder: Path, limit: int) -> list[Path]:
        """Up to `limit` `.py` files directly in `folder`, in name order, those read() may open."""
        try:
            names = sorted(e.name for e in os.scandir(folder) if e.name.endswith(".py"))
        except OSError:
            return []
        return [folder / n for n in names if self.allowed(folder / n)][:limit]


@dataclass
class _Module:
    stubs: dict[str, str]                       # top-level name -> its header text
    heads: dict[str, str]                       # the same, signature and docstring line only
    reexports: dict[str, tuple[int, str, str]]  # name -> (level, module, name there)

    @classmethod
    def parse(cls, text: str) -> "_Module | None":
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError, RecursionError):
            return None
        lines = text.splitlines()
        stubs: dict[str, str] = {}
        heads: dict[str, str] = {}
        reexports: dict[str, tuple[int, str, str]] = {}
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                stubs[node.name] = _stub(node, lines)
                heads[node.name] = "\n".join(_header(node) + ["    ..."])
            elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.end_lineno == node.lineno:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    if isinstance(t, ast.Name):
                        stubs[t.id] = heads[t.id] = _clip(lines[node.lineno - 1])
            elif isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    reexports[alias.asname or alias.name] = (node.level, node.module or "",
                                                             alias.name)
        return cls(stubs, heads, reexports)


def _clip(line: str) -> str:
    return line if len(line) <= MAX_LINE_CHARS else line[:MAX_LINE_CHARS - 3] + "..."


def _header(node: ast.AST, indent: str = "") -> list[str]:
    """Decorators and the signature on one line (ast.unparse: a signature spread over lines costs
    tokens for nothing), then the first docstring line."""
    bare = copy.copy(node)
    bare.body = [ast.Expr(ast.Constant(...))]
    out = [_clip(indent + line) for line in ast.unparse(bare).splitlines()[:-1]]
    doc = ast.get_docstring(node, clean=True)
    if doc and doc.strip():
        out.append(_clip(f'{indent}    """{doc.strip().splitlines()[0].strip()}"""'))
    return out


def _stub(node: ast.AST, lines: list[str]) -> str:
    out = _header(node)
    if isinstance(node, ast.ClassDef):
        fields, methods = [], []
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and item.lineno == item.end_lineno:
                fields.append(_clip("    " + lines[item.lineno - 1].strip()))
            elif (isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                  and (not item.name.startswith("_") or item.name == "__init__")):
                methods.append(item)
        out += fields[:MAX_FIELDS]
        for item in methods[:MAX_METHODS]:
            out += _header(item, "    ")
            out.append("        ...")
    else:
        out.append("    ...")
    return "\n".join(out)


def resolve_module(level: int, module: str, current: Path | None, roots: Sequence[Path]
                   ) -> list[Path]:
    """Candidate files for `from <level dots><module> import ...` in the file `current`."""
    parts = [p for p in module.split(".") if p]
    bases: list[Path] = []
    if level and current is not None:
        base = current.parent
        for _ in range(level - 1):
            base = base.parent
        bases.append(base)
    elif parts:
        if current is not None:
            # The top of the package `current` is in (folders with __init__.py), then its parent:
            # a package checked out anywhere in the workspace resolves its own absolute imports.
            top = current.parent
            while (top.parent / "__init__.py").exists() and top.parent != top:
                top = top.parent
            bases.append(top.parent)
        for root in roots:
            bases += [root, root / "src"]
    out = []
    for base in bases:
        target = base.joinpath(*parts) if parts else base
        out += [target.with_suffix(".py") if parts else target / "__init__.py",
                target / "__init__.py"]
    return list(dict.fromkeys(out))


@dataclass(frozen=True)
class Definition:
    name: str      # as the file writes it: `Config`, or `state.load` for a module's attribute
    path: Path     # the file it is defined in
    text: str      # its header: what the prompt shows (a class: with fields, method signatures)
    head: str = "" # signature and first docstring line only; text when empty

    @property
    def short(self) -> str:
        return self.head or self.text


@dataclass
class _Lookup:
    """One import_definitions call: where to look, what the file says, what it may still read."""
    source: WorkspaceSource
    current: Path | None
    open_docs: dict[Path, str]
    text: str
    budget: Budget

    def modules(self, level: int, module: str):
        for path in resolve_module(level, module, self.current, self.source.roots):
            mod = self.source.module(path, self.open_docs, self.budget)
            if mod is not None:
                yield path, mod


def _find(look: _Lookup, level: int, module: str, name: str, alias: str, depth: int = 0
          ) -> list[Definition]:
    """`from <module> import <name>`: the name's definition, or, when `name` is a module of its
    own (`from pkg import submodule`), the definitions of the attributes the file uses from it."""
    for path, mod in look.modules(level, module):
        if name in mod.stubs:
            return [Definition(alias, path, mod.stubs[name], mod.heads.get(name, ""))]
        if name in mod.reexports and depth < REEXPORT_DEPTH:
            lv, m, there = mod.reexports[name]
            found = _find(look, lv, m, there, there, depth + 1)
            if found:
                return [Definition(alias, d.path, d.text, d.head) for d in found[:1]]
        break
    return _module_definitions(look, level, f"{module}.{name}" if module else name, alias)


def _module_definitions(look: _Lookup, level: int, module: str, alias: str) -> list[Definition]:
    """The attributes the file reads as `alias.attr`, then the module's other signatures (one
    line each: the attribute about to be typed is likely among them)."""
    for path, mod in look.modules(level, module):
        used = [a for a in attributes_used(look.text, alias) if a in mod.stubs]
        out = [Definition(f"{alias}.{a}", path, mod.stubs[a], mod.heads.get(a, "")) for a in used]
        rest = [_first_signature(mod.heads[n]) for n in mod.heads if n not in used]
        rest = [line + " ..." for line in rest if line][:MAX_METHODS * 2]
        if rest:
            out.append(Definition(alias, path, "\n".join(rest)))
        return out
    return []


def _first_signature(head: str) -> str:
    for line in head.splitlines():
        if line.startswith(("def ", "async def ", "class ")):
            return line
    return ""


def import_definitions(source: WorkspaceSource, text: str, current: Path | None,
                       open_docs: dict[Path, str]) -> list[Definition]:
    """The definitions of the names `text` imports from workspace modules, in import order:
    `from M import name` gives name's; `import M` (or `from pkg import M`) gives those of the
    attributes read as `M.attr`, then M's other signatures. Names found in no open document nor
    workspace file (the standard library, installed packages) are left out."""
    look = _Lookup(source, current, open_docs, text, Budget(time.monotonic() + TIME_BUDGET_S))
    found: list[Definition] = []
    for level, module, names in imported_names_as(text):
        for name, alias in names:
            found += _find(look, level, module, name, alias)
    for module, alias in imported_modules(text):
        found += _module_definitions(look, 0, module, alias)
    out: list[Definition] = []
    seen: set[tuple[Path, str]] = set()
    for d in found:
        if (d.path, d.name) not in seen and d.path != current:
            seen.add((d.path, d.name))
            out.append(d)
    return out
