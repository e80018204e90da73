"""`codespec-lsp bench quality`: the points it asks, the scores, the JSON fields."""

import importlib.util
import json
import pathlib

import pytest

from codespec_lsp.bench.quality import (
    FIELDS,
    HELD_OUT,
    Point,
    baseline_text,
    quality_points,
    score,
    summarize,
)
from codespec_lsp.cli import main

ROOT = pathlib.Path(__file__).resolve().parent.parent

SOURCE = "".join(f"line_{i} = {i}\n" for i in range(25)) + (
    "def f(items):\n"
    "    found = []\n"
    "    for item in items:\n"
    "        found.append(item)\n"
    "    return found\n"
)


def test_points_alternate_line_start_and_mid_line_and_skip_the_head(tmp_path):
    (tmp_path / "a.py").write_text(SOURCE)
    points = quality_points([tmp_path / "a.py"], 8, seed=1, skip_lines=20)
    assert len(points) == 8
    assert len({p.offset for p in points}) == 8
    head = sum(len(line) + 1 for line in SOURCE.split("\n")[:20])
    for p in points:
        assert p.offset >= head
        line_start = SOURCE.rfind("\n", 0, p.offset) + 1
        before = SOURCE[line_start:p.offset]
        line = SOURCE[line_start:SOURCE.find("\n", p.offset)]
        if p.kind == "line_start":
            assert not before.strip()  # after the indentation, nothing typed yet
            assert len(before) == len(line) - len(line.lstrip())
        else:
            assert before.strip() and SOURCE[p.offset:SOURCE.find("\n", p.offset)].strip()
    assert [p.kind for p in points[:2]] == ["line_start", "mid_line"]


def test_scores_of_an_exact_a_wrong_and_a_missing_suggestion():
    offset = SOURCE.index("return found")
    point = Point("a.py", SOURCE, offset, "line_start")
    exact = score(point, "return found")
    assert exact["shown"] and exact["exact"] and exact["similarity"] == 1.0
    assert exact["prefix"] == len("return found")
    wrong = score(point, "return None")
    assert not wrong["exact"] and 0 < wrong["similarity"] < 1 and wrong["prefix"] == len("return ")
    none = score(point, None)
    assert not none["shown"] and none["similarity"] == 0 and none["prefix"] == 0
    loop = score(point, "run_run_run_run")
    assert loop["repetitive"]
    # the baseline repeats the previous non-blank line at the cursor's indentation
    assert baseline_text(SOURCE, offset) == "found.append(item)"


def test_summary_has_exactly_the_fields_and_means_over_all_points():
    point = Point("a.py", SOURCE, SOURCE.index("return found"), "line_start")
    out = summarize([score(point, "return found"), score(point, None)])
    assert tuple(out) == FIELDS
    assert out["points"] == 2 and out["shown_rate"] == 0.5
    assert out["exact_line"] == 0.5 and out["edit_similarity"] == 0.5
    assert out["repetitive_rate"] == 0.0


def test_the_held_out_set_is_not_training_data():
    spec = importlib.util.spec_from_file_location("train_tiny", ROOT / "scripts" / "train_tiny.py")
    train_tiny = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train_tiny)
    held_out = {f.read_text(encoding="utf-8") for f in HELD_OUT.glob("*.py")}
    assert len(held_out) >= 5
    trained = train_tiny.training_files()
    assert len(trained) > 100
    assert not [f for f in trained if f.read_text(encoding="utf-8", errors="replace") in held_out]


def test_the_held_out_set_is_apart_from_the_benchmark_corpus():
    # benchmarks/corpus is where the confidence threshold is measured (bench quality --sweep)
    corpus = {f.read_text(encoding="utf-8") for f in (ROOT / "benchmarks" / "corpus").glob("*.py")}
    assert corpus
    assert not {f.name for f in HELD_OUT.glob("*.py")} & {
        f.name for f in (ROOT / "benchmarks" / "corpus").glob("*.py")}
    assert not [f for f in HELD_OUT.glob("*.py") if f.read_text(encoding="utf-8") in corpus]


@pytest.mark.slow
def test_bench_quality_command_on_the_embedded_pair(tmp_path, monkeypatch):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.py").write_text(SOURCE)
    out = tmp_path / "q.json"
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert main(["bench", "quality", "--preset", "tiny", "--device", "cpu", "--corpus", str(corpus),
                 "--points", "4", "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert tuple(got) == FIELDS + ("by_kind",)
    assert got["points"] == 4
    kinds = got["by_kind"]  # the same figures at line starts and mid-line (points alternate)
    assert tuple(kinds) == ("line_start", "mid_line") and tuple(kinds["line_start"]) == FIELDS
    assert kinds["line_start"]["points"] + kinds["mid_line"]["points"] == 4
    for key in ("shown_rate", "exact_line", "edit_similarity", "repetitive_rate",
                "baseline_prev_line_similarity"):
        assert 0.0 <= got[key] <= 1.0
    assert got["prefix_match_chars"] >= 0


@pytest.mark.slow
def test_a_sweep_rescores_the_same_generations(tmp_path, monkeypatch):
    from codespec_lsp.bench.quality import quality_bench
    from codespec_lsp.engine import load_engine
    from codespec_lsp.completion.postprocess import DEFAULT_MIN_CONFIDENCE

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    (tmp_path / "a.py").write_text(SOURCE)
    engine = load_engine(preset="tiny", device="cpu")
    sweep = (0.0, DEFAULT_MIN_CONFIDENCE, 0.999)
    got = quality_bench(engine, corpus=tmp_path, points=6, sweep=sweep)
    by = {t: got["sweep"][str(t)] for t in sweep}
    # the default threshold, re-applied, gives what complete_at itself showed
    assert by[DEFAULT_MIN_CONFIDENCE] == {k: got[k] for k in FIELDS}
    assert all(s["points"] == 6 for s in by.values())
    shown = [by[t]["shown_rate"] for t in sweep]
    assert shown == sorted(shown, reverse=True)  # a stricter threshold never shows more


def test_a_point_is_asked_on_the_file_as_it_stood_while_its_line_was_typed():
    offset = SOURCE.index("found.append(item)") + len("found.app")
    doc = Point("a.py", SOURCE, offset, "mid_line").document
    # the line ends at the cursor; everything above and below is there
    assert doc == SOURCE[:offset] + SOURCE[SOURCE.index("\n", offset):]
    assert doc.split("\n")[-3:] == ["        found.app", "    return found", ""]
    last = len(SOURCE) - 1  # a point on a last line with no newline after it
    assert Point("a.py", SOURCE[:-1], last - 3, "mid_line").document == SOURCE[:last - 3]


def test_a_model_that_types_the_real_code_scores_every_point_exact(tmp_path):
    """The bench asks before the line is typed: an oracle's suggestion is the real line, not a
    re-typing of a suffix already in the document (which the server must drop)."""
    from codespec_lsp.bench.quality import quality_bench
    from tests.fake_engine import FakeEngine

    (tmp_path / "a.py").write_text(SOURCE)

    def oracle(prompt: str) -> str:
        tail = prompt[-40:]
        assert SOURCE.count(tail) == 1
        return SOURCE[SOURCE.index(tail) + len(tail):]
    got = quality_bench(FakeEngine(oracle), corpus=tmp_path, points=8)
    assert got["points"] == 8
    assert got["shown_rate"] == 1.0 and got["exact_line"] == 1.0 and got["edit_similarity"] == 1.0
    assert got["prefix_match_chars"] >= 4


@pytest.mark.parametrize("context", [True, False])
def test_with_the_corpus_as_workspace_the_prompt_may_read_other_files_never_the_asked_one(
        tmp_path, context):
    """`--workspace-root`: an editor opened on the corpus. The workspace context may retrieve
    from the other files, but the asked file's saved text holds the answer and is never shown."""
    from codespec_lsp.bench.quality import quality_bench
    from tests.fake_engine import FakeEngine

    other = SOURCE.replace("line_", "row_")
    (tmp_path / "a.py").write_text(SOURCE)
    (tmp_path / "b.py").write_text(other)
    prompts: list[str] = []

    def record(prompt: str) -> str:
        prompts.append(prompt)
        return "x\n"
    alone = quality_bench(FakeEngine(record), corpus=tmp_path, points=8)
    plain = list(prompts)
    prompts.clear()
    got = quality_bench(FakeEngine(record), corpus=tmp_path, points=8, workspace_root=True,
                        workspace_context=context)
    assert got["points"] == alone["points"] == 8 and len(prompts) == len(plain)
    for prompt in prompts:  # the asked file's text starts last: a cut at 0, after any context
        asked, first = ("a.py", "line_0 = 0") if prompt.rfind("line_0 = 0") > \
            prompt.rfind("row_0 = 0") else ("b.py", "row_0 = 0")
        # its path heads its own text once (context._header), never a block of it before
        assert prompt.count(f"# {asked}\n") == 1 and f"# {asked}\n{first}" in prompt
    if context:
        assert any("# a.py\n" in p or "# b.py\n" in p for p in prompts)
    else:
        assert prompts == plain
