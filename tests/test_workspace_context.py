"""Workspace context (issue 27): the definitions of imported names, before the file, fixed at the
cut; bounded, root-confined disk reads."""

import os
from pathlib import Path

import pytest

from codespec_lsp.bench.context import context_points, siblings, SAMPLE
from codespec_lsp.completion.context import CONTEXT_SHARE, ContextBuilder
from codespec_lsp.completion import workspace
from codespec_lsp.completion.workspace import imported_modules, imported_names
from codespec_lsp.config import normalize

from test_context import CountingTokenizer

MODELS = '''from dataclasses import dataclass

@dataclass
class Config:
    """Where and how to serve."""
    host: str
    port: int = 8080

    def url(self, path: str) -> str:
        """The address of `path` on this server."""
        return f"http://{self.host}:{self.port}{path}"

    def _private(self):
        pass

def load_config(path: str) -> Config:
    """Reads a Config from a TOML file."""
    return Config("x")

RETRIES = 3
'''
MAIN = "import os\nfrom collections import deque\nfrom .models import Config, load_config, RETRIES\n\n\ndef run(path):\n    cfg = "
HEADER = "# app/main.py\n"  # the file's path heads its text while the prompt starts at its start


def package(tmp_path: Path) -> Path:
    pkg = tmp_path / "ws" / "app"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "models.py").write_text(MODELS)
    (pkg / "main.py").write_text(MAIN)
    return pkg


def build(b, pkg, src=MAIN, offset=None, others=(), roots=None):
    key = (pkg / "main.py").as_uri()
    roots = [(pkg.parent).as_uri()] if roots is None else roots
    return b.build(key, src, len(src) if offset is None else offset, others, roots)


def test_imported_names_reads_parenthesised_and_aliased_imports():
    src = "from .a import (x,\n    y as z,  # c\n)\nfrom ..b.c import w\nimport os\nfrom d import *\n"
    assert imported_names(src) == [(1, "a", ["x", "y"]), (2, "b.c", ["w"])]


def test_definitions_from_disk_go_before_the_file(tmp_path):
    pkg = package(tmp_path)
    p = build(ContextBuilder(CountingTokenizer(), 400, workspace_context=True,
                             context_detail="members"), pkg)
    head, _, rest = p.text.partition("import os")
    assert rest.endswith("cfg = ") and p.prefix == MAIN
    assert head.startswith("# app/models.py\n")
    assert "def load_config(path: str) -> Config:\n    \"\"\"Reads a Config from a TOML file.\"\"\"" in head
    assert "class Config:" in head and "    port: int = 8080" in head
    assert "    def url(self, path: str) -> str:" in head and "_private" not in head
    assert "RETRIES = 3" in head
    assert "return Config" not in head  # signatures, not bodies


def test_open_document_wins_over_disk(tmp_path):
    pkg = package(tmp_path)
    edited = MODELS.replace("def load_config(path: str)", "def load_config(path: str, strict: bool)")
    p = build(ContextBuilder(CountingTokenizer(), 400, workspace_context=True), pkg,
              others=[((pkg / "models.py").as_uri(), edited)])
    assert "def load_config(path: str, strict: bool) -> Config:" in p.text


def test_nothing_found_leaves_the_prompt_as_without_context(tmp_path):
    pkg = package(tmp_path)
    src = "import os\nfrom collections import deque\n\nx = "
    on = build(ContextBuilder(CountingTokenizer(), 400, workspace_context=True), pkg, src)
    off = build(ContextBuilder(CountingTokenizer(), 400), pkg, src)
    assert on.text == off.text == HEADER + src


def test_off_reads_nothing(tmp_path):
    pkg = package(tmp_path)
    assert build(ContextBuilder(CountingTokenizer(), 400), pkg).text == HEADER + MAIN


def test_no_reads_outside_the_roots(tmp_path):
    pkg = package(tmp_path)
    other_root = tmp_path / "elsewhere"
    other_root.mkdir()
    p = build(ContextBuilder(CountingTokenizer(), 400, workspace_context=True), pkg,
              roots=[other_root.as_uri()])
    assert p.text == "# main.py\n" + MAIN  # outside the roots its header is its name alone


def test_a_link_out_of_the_root_is_not_followed(tmp_path):
    pkg = package(tmp_path)
    outside = tmp_path / "secret_models.py"
    outside.write_text(MODELS)
    (pkg / "models.py").unlink()
    os.symlink(outside, pkg / "models.py")
    p = build(ContextBuilder(CountingTokenizer(), 400, workspace_context=True), pkg)
    assert p.text == HEADER + MAIN


@pytest.mark.parametrize("pattern", ["models.py", "app/models.py", "/app/", "*.py\n!main.py"])
def test_gitignored_files_are_skipped(tmp_path, pattern):
    pkg = package(tmp_path)
    (pkg.parent / ".gitignore").write_text(pattern + "\n")
    p = build(ContextBuilder(CountingTokenizer(), 400, workspace_context=True), pkg)
    assert p.text == HEADER + MAIN


def test_a_negated_pattern_keeps_the_file(tmp_path):
    pkg = package(tmp_path)
    (pkg.parent / ".gitignore").write_text("*.py\n!models.py\n")
    p = build(ContextBuilder(CountingTokenizer(), 400, workspace_context=True), pkg)
    assert "def load_config" in p.text


def test_binary_files_are_skipped(tmp_path):
    pkg = package(tmp_path)
    (pkg / "models.py").write_bytes(MODELS.encode() + b"\0\1\2")
    p = build(ContextBuilder(CountingTokenizer(), 400, workspace_context=True), pkg)
    assert p.text == HEADER + MAIN


def test_context_stays_within_its_share_and_the_prompt_within_budget(tmp_path):
    pkg = package(tmp_path)
    many = "".join(f"def helper_{i}(a, b, c):\n    \"\"\"Helper number {i}.\"\"\"\n\n" for i in range(200))
    (pkg / "models.py").write_text(many)
    names = ", ".join(f"helper_{i}" for i in range(200))
    src = f"from .models import ({names})\n\n" + "x = 1\n" * 300 + "y = "
    tok = CountingTokenizer()
    b = ContextBuilder(tok, 400, workspace_context=True)
    p = build(b, pkg, src)
    context = p.text[:len(p.text) - len(p.prefix)]
    assert "def helper_" in context
    assert tok(context) <= 400 * CONTEXT_SHARE and tok(p.text) <= 400


def test_context_is_kept_while_typing_and_refreshed_at_the_next_cut(tmp_path):
    """KV reuse: each keystroke's prompt extends the last one; an edit of another document is
    seen at the next cut, not before."""
    pkg = package(tmp_path)
    tok = CountingTokenizer()
    b = ContextBuilder(tok, 400, workspace_context=True)
    src = MAIN
    first = build(b, pkg, src)
    (pkg / "models.py").write_text(MODELS.replace("(path: str)", "(path: str, strict: bool)"))
    for ch in "load_config(path)":
        src += ch
        p = build(b, pkg, src)
        assert p.text.startswith(first.text) and p.cut == first.cut
    assert "strict" not in p.text
    src = src + "\n" + "    x = 1\n" * 400 + "    y = "  # outgrows the budget: a re-cut
    again = build(b, pkg, src)
    assert again.cut > 0 and "def load_config(path: str, strict: bool)" in again.text


def test_old_setting_name_is_accepted_for_the_new_one():
    assert normalize({"otherDocuments": False})[0] == {"workspace_context": False}
    assert normalize({"workspaceContext": True})[0] == {"workspace_context": True}


def test_bench_points_use_a_sibling_name_at_the_line_start():
    pts = context_points(SAMPLE, 30)
    assert 15 <= len(pts) <= 30  # at most a third (10) from one file
    for cp in pts:
        line = cp.point.source[cp.point.offset:].split("\n", 1)[0]
        assert cp.names and all(n in line for n in cp.names)
        assert cp.point.source[:cp.point.offset].split("\n")[-1].strip() == ""
    names, modules, files = siblings(SAMPLE / "shelfkit" / "desk.py",
                                     (SAMPLE / "shelfkit" / "desk.py").read_text(), SAMPLE)
    assert {"Catalog", "fee_cents", "Loan"} <= names and "date" not in names
    assert {f.name for f in files} == {"errors.py", "fees.py", "models.py", "store.py"}
    assert modules == set()


def test_server_request_carries_the_workspace_folders_and_other_documents_by_uri():
    """The lsp seam: `initialize`'s folders reach the prompt builder, other documents keep their
    URI (their path is how an import finds them)."""
    from lsprotocol import types
    from codespec_lsp.lsp import documents
    from codespec_lsp.lsp.server import build_server

    server = build_server(loader=lambda settings: None)
    folder = types.WorkspaceFolder(uri="file:///ws/proj", name="proj")
    server.protocol._workspace = documents.Workspace("file:///ws/proj", workspace_folders=[folder])
    for uri, text in (("file:///ws/proj/app/main.py", MAIN), ("file:///ws/proj/app/models.py", MODELS)):
        server.workspace.put_text_document(types.TextDocumentItem(uri, "python", 1, text))
    req = server.request_for("file:///ws/proj/app/main.py", types.Position(6, 10))
    assert req.roots == ["file:///ws/proj"]
    assert [uri for uri, _ in req.others] == ["file:///ws/proj/app/models.py"]


USES_MODULES = ("import os\nimport app.models\nimport app.models as m\nfrom app import models\n\n\n"
                "def run(path):\n    m.load_config(path)\n    x = ")


def test_imported_modules_reads_plain_and_aliased_imports():
    src = "import os, app.models\nimport app.models as m  # c\nfrom x import y\nimport a as b, c.d\n"
    assert imported_modules(src) == [("os", "os"), ("app.models", "app.models"),
                                     ("app.models", "m"), ("a", "b"), ("c.d", "c.d")]


@pytest.mark.parametrize("line", ["import app.models as m", "from app import models as m",
                                  "from . import models as m"])
def test_a_module_import_gives_the_attributes_the_file_reads(tmp_path, line):
    """`m.load_config(...)` in the file: load_config's definition; the module's other
    signatures one line each (the attribute about to be typed may be any of them)."""
    pkg = package(tmp_path)
    src = f"{line}\n\n\ndef run(path):\n    m.load_config(path)\n    x = "
    (pkg / "main.py").write_text(src)
    p = build(ContextBuilder(CountingTokenizer(), 400, workspace_context=True), pkg, src)
    head = p.text[:len(p.text) - len(p.prefix)]
    assert 'def load_config(path: str) -> Config:\n    """Reads a Config from a TOML file."""' in head
    assert "class Config: ..." in head and "host: str" not in head
    assert p.prefix == src


def test_a_module_attribute_not_defined_there_adds_nothing_but_the_overview(tmp_path):
    pkg = package(tmp_path)
    src = "import app.models as m\n\nm.nothing_here()\nx = "
    p = build(ContextBuilder(CountingTokenizer(), 400, workspace_context=True), pkg, src)
    head = p.text[:len(p.text) - len(p.prefix)]
    assert "def load_config(path: str) -> Config: ..." in head and "nothing_here" not in head


def test_an_installed_module_adds_nothing(tmp_path):
    pkg = package(tmp_path)
    src = "import os.path\nimport json as j\n\nx = j.loads(os.path.join('a'))\ny = "
    on = build(ContextBuilder(CountingTokenizer(), 400, workspace_context=True), pkg, src)
    assert on.text == HEADER + src


def test_signatures_detail_the_default_leaves_out_fields_and_methods(tmp_path):
    pkg = package(tmp_path)
    p = build(ContextBuilder(CountingTokenizer(), 400, workspace_context=True), pkg)
    head = p.text[:len(p.text) - len(p.prefix)]
    assert 'class Config:\n    """Where and how to serve."""\n    ...' in head
    assert "port: int" not in head and "def url" not in head
    assert "def load_config(path: str) -> Config:" in head


def test_comment_form_makes_every_context_line_a_comment(tmp_path):
    pkg = package(tmp_path)
    p = build(ContextBuilder(CountingTokenizer(), 400, workspace_context=True,
                             context_form="comment"), pkg)
    head = p.text[:len(p.text) - len(p.prefix)]
    assert "# def load_config(path: str) -> Config:" in head
    assert all(line.startswith("# ") for line in head.splitlines() if line.strip())


@pytest.mark.parametrize("share", [0.1, 0.4])
def test_context_share_bounds_the_context(tmp_path, share):
    pkg = package(tmp_path)
    many = "".join(f"def helper_{i}(a, b, c):\n    \"\"\"Helper number {i}.\"\"\"\n\n" for i in range(200))
    (pkg / "models.py").write_text(many)
    src = "from .models import (" + ", ".join(f"helper_{i}" for i in range(200)) + ")\n\ny = "
    tok = CountingTokenizer()
    p = build(ContextBuilder(tok, 400, workspace_context=True, context_share=share), pkg, src)
    context = p.text[:len(p.text) - len(p.prefix)]
    assert 400 * share * 0.6 <= tok(context) <= 400 * share


def test_files_over_the_size_limit_are_skipped(tmp_path, monkeypatch):
    pkg = package(tmp_path)
    monkeypatch.setattr(workspace, "MAX_FILE_BYTES", len(MODELS) - 1)
    assert build(ContextBuilder(CountingTokenizer(), 400, workspace_context=True), pkg).text == HEADER + MAIN


def test_disk_reads_stop_at_the_count_limit(tmp_path, monkeypatch):
    pkg = package(tmp_path)
    (pkg / "extra.py").write_text("def extra_helper(a):\n    return a\n")
    src = "from .models import load_config\nfrom .extra import extra_helper\n\nx = "
    monkeypatch.setattr(workspace, "MAX_DISK_FILES", 1)
    p = build(ContextBuilder(CountingTokenizer(), 400, workspace_context=True), pkg, src)
    assert "def load_config" in p.text and "def extra_helper" not in p.text


def test_disk_reads_stop_at_the_time_limit(tmp_path, monkeypatch):
    pkg = package(tmp_path)
    monkeypatch.setattr(workspace, "TIME_BUDGET_S", -1.0)
    assert build(ContextBuilder(CountingTokenizer(), 400, workspace_context=True), pkg).text == HEADER + MAIN


def test_bench_points_include_module_attribute_lines(tmp_path):
    pkg = package(tmp_path)
    (pkg / "main.py").write_text(USES_MODULES + "load_config\n    y = models.RETRIES + 1\n")
    pts = context_points(pkg.parent, 30)
    names = {n for cp in pts for n in cp.names}
    assert {"m.load_config", "models.RETRIES", "app.models"} - names == {"app.models"}
    names, modules, files = siblings(pkg / "main.py", USES_MODULES, pkg.parent)
    assert modules == {"app.models", "m", "models"} and names == set()
    assert [f.name for f in files] == ["models.py"]


def test_bench_context_scores_what_the_context_gives_and_the_keystroke_prefill(tmp_path):
    """A model that writes the right call only when the definition is in its prompt: every
    point exact with context, none without; typing after a point reruns a few tokens only."""
    from codespec_lsp.bench.context import context_bench
    from tests.fake_engine import FakeEngine

    pkg = package(tmp_path)
    body = "".join(f"    c{i} = load_config('{i}.toml')\n" for i in range(6))
    (pkg / "main.py").write_text("from .models import load_config\n\n\ndef run():\n" + body)

    def needs_context(prompt: str) -> str:
        if "def load_config(path: str) -> Config:" not in prompt:
            return "open(path)\n"
        line = prompt.rsplit("\n", 1)[-1]
        i = len([ln for ln in prompt.split("\n") if ln.startswith("    c")])
        return f"c{i} = load_config('{i}.toml')\n"[len(line.strip()):]
    got = context_bench(FakeEngine(needs_context), package=pkg.parent, points=18,
                        keystroke_points=2)  # a third of 18: all 6 lines of main.py
    assert got["with_context"]["points"] == got["without_context"]["points"] == 6
    assert got["with_context"]["exact_line"] == 1.0 and got["with_context"]["name_hit"] == 1.0
    assert got["without_context"]["exact_line"] == 0.0 and got["without_context"]["name_hit"] == 0.0
    for variant in ("with_context", "without_context"):  # typing costs a few tokens either way
        assert 0 < got[variant]["prefill_tokens_per_keystroke"] <= 4
        assert got[variant]["keystroke_ms_p50"] > 0


def test_usages_detail_adds_how_the_open_documents_call_a_name(tmp_path):
    pkg = package(tmp_path)
    (pkg / "cli.py").write_text("")
    cli = ("from .models import load_config, Config\n\n"
           "def main(argv):\n"
           "    cfg = load_config(argv[1])\n"
           "    # load_config reads TOML\n"
           "    again = load_config(argv[1])\n"
           "    third = load_config('x')\n")
    others = [((pkg / "cli.py").as_uri(), cli), ((pkg / "models.py").as_uri(), MODELS)]
    p = build(ContextBuilder(CountingTokenizer(), 1200, workspace_context=True,
                             context_detail="usages", context_windows=0), pkg, others=others)
    head = p.text.partition("import os")[0]
    # two uses a name, under its signature: not the import, the comment, nor a third
    assert ("def load_config(path: str) -> Config:\n    \"\"\"Reads a Config from a TOML file.\"\"\"\n"
            "    ...\n# e.g. cfg = load_config(argv[1])\n# e.g. again = load_config(argv[1])\n") in head
    assert "third" not in head and "# e.g. from" not in head and "# e.g. \"\"\"" not in head
    assert "# e.g. return Config(\"x\")" in head  # the defining module's own uses count too
    assert "# e.g. RETRIES" not in head  # its definition is already shown
    # the signatures detail adds no uses
    plain = build(ContextBuilder(CountingTokenizer(), 1200, workspace_context=True), pkg,
                  others=others)
    assert "# e.g." not in plain.text


def test_near_placement_puts_the_context_before_the_statement_being_written(tmp_path):
    """context_place="near": the definitions go right above the top-level statement (with its
    decorators and comments) the cursor is in, fixed at the cut; each keystroke extends the prompt."""
    pkg = package(tmp_path)
    src = MAIN.replace("\n\ndef run(path):", "\n\ndef other():\n    return 1\n\n\n# runs it\n@trace\ndef run(path):")
    b = ContextBuilder(CountingTokenizer(), 400, workspace_context=True, context_place="near")
    first = build(b, pkg, src)
    before, _, after = first.text.partition("# app/models.py\n")
    assert before == HEADER + src[:src.index("# runs it")]  # the file above the statement, unchanged
    assert after.endswith(src[src.index("# runs it"):])  # then the statement being written
    assert "def load_config(path: str) -> Config:" in after and first.prefix == src
    for ch in "load_config(path)":
        src += ch
        p = build(b, pkg, src)
        assert p.text.startswith(first.text) and p.text.endswith(src[-20:])
    top = build(ContextBuilder(CountingTokenizer(), 400, workspace_context=True), pkg, src)
    assert top.text.startswith("# app/models.py\n") and sorted(top.text) == sorted(p.text)


EDITED_CALLER = "def serve(path):\n    cfg = load_config(path)\n    return cfg.url('/')"
EDITED_OTHER = "def unrelated():\n    return 42"


def test_edited_spans_go_nearest_the_file_the_most_like_the_lines_above_first(tmp_path):
    pkg = package(tmp_path)
    tok = CountingTokenizer()
    b = ContextBuilder(tok, 400, workspace_context=True, edit_chunks=1)
    edits = [((pkg / "other.py").as_uri(), EDITED_OTHER), ((pkg / "cli.py").as_uri(), EDITED_CALLER)]
    key = (pkg / "main.py").as_uri()
    src = MAIN.replace("    cfg = ", "    cfg = load_config(path)\n    url = cfg.url(path)\n    ")
    p = b.build(key, src, len(src), (), [pkg.parent.as_uri()], edits)
    head = p.text[:len(p.text) - len(p.prefix)].removesuffix(HEADER)
    assert head.endswith(f"# app/cli.py\n{EDITED_CALLER}\n\n") and "unrelated" not in head
    assert head.index("def load_config(path: str) -> Config:") < head.index("# app/cli.py")
    assert tok(f"# app/cli.py\n{EDITED_CALLER}\n\n") <= 400 * b.edit_share


def test_edited_spans_are_not_shown_without_workspace_context_or_over_their_share(tmp_path):
    pkg = package(tmp_path)
    edits = [((pkg / "cli.py").as_uri(), EDITED_CALLER)]
    off = ContextBuilder(CountingTokenizer(), 400).build((pkg / "main.py").as_uri(), MAIN,
                                                           len(MAIN), (), [], edits)
    assert off.text == "# main.py\n" + MAIN  # no roots: the header is the file's name
    tight = ContextBuilder(CountingTokenizer(), 400, workspace_context=True, edit_share=0.01)
    p = tight.build((pkg / "main.py").as_uri(), MAIN, len(MAIN), (), [pkg.parent.as_uri()], edits)
    assert "def serve" not in p.text


def test_edited_spans_are_kept_while_typing_and_refreshed_at_the_next_cut(tmp_path):
    """KV reuse: a new edit elsewhere does not move the prompt's start until the next cut."""
    pkg = package(tmp_path)
    b = ContextBuilder(CountingTokenizer(), 400, workspace_context=True)
    key, roots = (pkg / "main.py").as_uri(), [pkg.parent.as_uri()]
    first = b.build(key, MAIN, len(MAIN), (), roots, [((pkg / "cli.py").as_uri(), EDITED_CALLER)])
    src, later = MAIN, [((pkg / "other.py").as_uri(), "def fresh_edit(path):\n    load_config(path)")]
    for ch in "load_config(path)":
        src += ch
        p = b.build(key, src, len(src), (), roots, later)
        assert p.text.startswith(first.text) and "fresh_edit" not in p.text
    src = src + "\n" + "    x = 1\n" * 400 + "    y = "  # outgrows the budget: a re-cut
    assert "fresh_edit" in b.build(key, src, len(src), (), roots, later).text


def test_server_request_carries_the_other_documents_edits_latest_first():
    from lsprotocol import types
    from codespec_lsp.lsp import documents
    from codespec_lsp.lsp.server import build_server

    server = build_server(loader=lambda settings: None)
    server.protocol._workspace = documents.Workspace("file:///ws/proj")
    main, models = "file:///ws/proj/app/main.py", "file:///ws/proj/app/models.py"
    for uri, text in ((main, MAIN), (models, MODELS)):
        server.workspace.put_text_document(types.TextDocumentItem(uri, "python", 1, text))
    load_line = MODELS.split("\n").index("def load_config(path: str) -> Config:")
    for uri, line, version in ((models, 2, 2), (main, 5, 2), (models, load_line, 3)):
        server.workspace.update_text_document(
            types.VersionedTextDocumentIdentifier(uri=uri, version=version),
            types.TextDocumentContentChangePartial(
                range=types.Range(types.Position(line, 0), types.Position(line, 0)), text="# "))
    req = server.request_for(main, types.Position(6, 10))
    assert [uri for uri, _ in req.edits] == [models, models]  # main's own edit is in the file
    assert req.edits[0][1].split("\n")[1] == "# def load_config(path: str) -> Config:"
