"""Retrieved windows (completion/retrieval.py): the lines of other workspace files most like those
above the cursor, after the definitions, within their share, from the same bounded reads."""

import os

from codespec_lsp.completion import retrieval
from codespec_lsp.completion.context import ContextBuilder
from codespec_lsp.completion.retrieval import jaccard, similar_windows, words
from codespec_lsp.completion.workspace import WorkspaceSource

from test_context import CountingTokenizer
from test_workspace_context import MAIN, build, package

USER = '''from .models import Config, load_config


def serve(path):
    cfg = load_config(path)
    server = Server(cfg.host, cfg.port, retries=cfg.retries)
    server.start()
'''
UNRELATED = "\n".join(f"alpha_{i} = beta_{i} + gamma_{i}" for i in range(20)) + "\n"
# The file being written: its last lines are much like USER's serve.
WRITING = MAIN + "load_config(path)\n    server = Server(cfg.host, "


def windows(pkg, **options):
    b = ContextBuilder(CountingTokenizer(), 800, workspace_context=True, **options)
    p = build(b, pkg, WRITING)
    return p, p.text[:len(p.text) - len(p.prefix)].removesuffix("# app/main.py\n")  # the file's own header


def test_jaccard_of_identifiers():
    a, b = words("cfg = load_config(path)"), words("x = load_config(cfg)")
    assert a == {"cfg", "load_config", "path"} and jaccard(a, b) == 2 / 4
    assert jaccard(frozenset(), frozenset()) == 0.0


def test_the_most_similar_window_of_a_file_beside_goes_after_the_definitions(tmp_path):
    pkg = package(tmp_path)
    (pkg / "user.py").write_text(USER)
    (pkg / "noise.py").write_text(UNRELATED)
    p, context = windows(pkg, context_windows=2, window_share=0.5)
    definitions, _, shown = context.partition("# app/user.py\n")
    assert "def load_config(path: str) -> Config:" in definitions
    assert "server = Server(cfg.host, cfg.port, retries=cfg.retries)" in shown
    assert "alpha_" not in context  # under MIN_SIMILARITY
    assert p.text.endswith(WRITING) and p.prefix == WRITING


def test_one_window_by_default_none_when_off_and_none_from_the_current_file(tmp_path):
    pkg = package(tmp_path)
    (pkg / "main.py").write_text(WRITING + "cfg.port)\n    server.start()\n")  # saved, further on
    (pkg / "user.py").write_text(USER)
    off = ContextBuilder(CountingTokenizer(), 800, workspace_context=True, context_windows=0)
    assert "# app/user.py" not in build(off, pkg, WRITING).text
    default = ContextBuilder(CountingTokenizer(), 800, workspace_context=True)
    assert build(default, pkg, WRITING).text.count("# app/user.py\n") == 1
    context = windows(pkg, context_windows=3, window_share=0.5)[1]
    assert "# app/user.py" in context and "# app/main.py" not in context


def test_windows_stay_within_their_share(tmp_path):
    pkg = package(tmp_path)
    for i in range(4):
        (pkg / f"user{i}.py").write_text(USER.replace("retries", f"retries{i}"))
    tokens = CountingTokenizer()
    b = ContextBuilder(tokens, 800, workspace_context=True, context_windows=4, window_share=0.1)
    p = build(b, pkg, WRITING)
    shown = p.text[p.text.index("# app/user"):len(p.text) - len(p.prefix)]
    assert 0 < tokens(shown) <= 80 and shown.count("# app/user") == 1


def test_windows_come_only_from_files_the_workspace_may_read(tmp_path):
    pkg = package(tmp_path)
    (pkg.parent / ".gitignore").write_text("ignored.py\n")
    (pkg / "ignored.py").write_text(USER)
    outside = tmp_path / "outside.py"
    outside.write_text(USER)
    os.symlink(outside, pkg / "linked.py")
    (pkg / "binary.py").write_bytes(USER.encode() + b"\0")
    assert "server = Server" not in windows(pkg, context_windows=2, window_share=0.5)[1]
    # An open document is the user's own text: it counts wherever it lives.
    found = similar_windows(WorkspaceSource(), WRITING, pkg / "main.py", {outside: USER}, 2)
    assert [w.path for w in found] == [outside] and "Server(cfg.host" in found[0].text


def test_a_window_is_scored_once_per_text(tmp_path, monkeypatch):
    pkg = package(tmp_path)
    (pkg / "user.py").write_text(USER)
    made = []
    real = retrieval.windows_of
    monkeypatch.setattr(retrieval, "windows_of", lambda text: made.append(text) or real(text))
    source = WorkspaceSource()
    source.set_roots([pkg.parent.as_uri()])
    for _ in range(3):
        assert similar_windows(source, WRITING, pkg / "main.py", {}, 1)
    assert made.count(USER) == 1
    (pkg / "user.py").write_text(USER + "# edited\n")
    similar_windows(source, WRITING, pkg / "main.py", {}, 1)
    assert made.count(USER + "# edited\n") == 1
