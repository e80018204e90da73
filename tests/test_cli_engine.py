"""`codespec-lsp complete` and `codespec-lsp bench engine` end to end on the embedded pair."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from codespec_lsp.bench.engine import engine_bench
from codespec_lsp.cli import main
from codespec_lsp.engine import load_engine

pytestmark = pytest.mark.slow
DEMO = Path(__file__).resolve().parent.parent / "examples" / "demo.py"

BENCH_FIELDS = ["preset", "device", "draft", "drafter", "cpu_linear", "points", "lossless", "acceptance_rate",
                "by_source", "tokens_per_target_forward", "speedup", "draft_cost_ratio", "verify_cost_by_k", "time_split_s", "time_split_per_request_ms",
                "next_token_accuracy", "unigram_accuracy",
                "prompt_window_tokens", "next_token_accuracy_prompt_window",
                "prefill_tokens_per_keystroke", "prefill_tokens_per_keystroke_nocache",
                "cancel_latency_ms_p95", "target_forward_ms_p50", "second_corpus"]


def test_complete_json_matches_plain_and_target_only(capsys):
    assert main(["complete", str(DEMO), "--line", "12", "--col", "0", "--json", "--max-tokens", "24", "--preset", "tiny"]) == 0
    spec = json.loads(capsys.readouterr().out)
    assert main(["complete", str(DEMO), "--line", "12", "--col", "0", "--json", "--max-tokens", "24", "--preset", "tiny",
                 "--no-speculative"]) == 0
    alone = json.loads(capsys.readouterr().out)
    assert spec["text"] == alone["text"]  # lossless through the whole pipeline
    assert alone["proposed"] == 0 and alone["draft_forwards"] == 0
    for key in ("target_forwards", "draft_forwards", "proposed", "accepted", "prefill_tokens",
                "reused_tokens", "wall_s", "cancelled"):
        assert key in spec
    assert spec["prefill_tokens"] > 50 and not spec["cancelled"]
    assert main(["complete", str(DEMO), "--line", "12", "--col", "0", "--max-tokens", "24", "--preset", "tiny"]) == 0
    assert capsys.readouterr().out.rstrip("\n") == spec["text"]


def test_complete_rejects_positions_outside_the_file(capsys):
    assert main(["complete", str(DEMO), "--line", "999", "--col", "0"]) == 2
    assert "outside the file" in capsys.readouterr().err
    assert main(["complete", str(DEMO), "--line", "0", "--col", "500"]) == 2
    assert "past the end of line 0" in capsys.readouterr().err


def test_bench_engine_fields_and_invariants():
    engine = load_engine(preset="tiny", device="cpu")
    engine.fixed_k = 2  # drafting on every step, so the cost ratio is measured however K adapts
    out = engine_bench(engine, points=2, max_tokens=12, keystrokes=3, cancel_trials=2)
    assert list(out) == BENCH_FIELDS
    assert out["points"] == 2 and out["preset"] == "tiny" and out["device"] == "cpu"
    # the row counts (as JSON keys) where another form beat F.linear on this CPU, and that form
    assert set(out["cpu_linear"]) <= {str(n) for n in (*range(1, 9), 64)}
    assert set(out["cpu_linear"].values()) <= {"transposed", "packed"}
    assert out["lossless"] is True
    split = out["time_split_s"]
    assert split["target"]["draft_s"] == 0.0 and split["spec"]["verify_s"] > 0.0
    per_request = out["time_split_per_request_ms"]
    assert per_request["spec"]["verify_ms"] > 0.0 and set(per_request["target"]) == {
        "prefill_ms", "draft_ms", "verify_ms", "other_ms"}
    assert all(v >= 0.0 for d in split.values() for v in d.values())
    assert 0.0 <= out["acceptance_rate"] <= 1.0 and out["tokens_per_target_forward"] >= 1.0
    # Per source: its own branch's counts. Branches of one token tree that start alike both
    # count the shared kept tokens, and only the winner's count in the total, so the total's
    # rate is at most the sources' summed one; with one source they are the same figure.
    sources = out["by_source"].values()
    proposed, accepted = sum(s["proposed"] for s in sources), sum(s["accepted"] for s in sources)
    assert 0 < out["acceptance_rate"] <= (accepted / proposed if proposed else 0.0) + 1e-3
    if len(out["by_source"]) == 1:
        assert abs(accepted / proposed - out["acceptance_rate"]) < 1e-3
    assert out["draft"] == engine.draft_name is not None and out["drafter"] == "auto"
    verify = out["verify_cost_by_k"]
    assert verify[0] == 1.0 and verify == sorted(verify) and len(verify) == 9
    # the run proposed drafts (fixed_k below), so c is measured, positive and finite
    assert out["draft_cost_ratio"] is not None and 0.0 < out["draft_cost_ratio"] < 100.0
    assert out["next_token_accuracy"] > out["unigram_accuracy"] > 0
    assert out["prompt_window_tokens"] > 512  # the length completion prompts really reach
    assert out["next_token_accuracy_prompt_window"] > out["unigram_accuracy"]
    assert out["prefill_tokens_per_keystroke"] < out["prefill_tokens_per_keystroke_nocache"]
    assert out["prefill_tokens_per_keystroke_nocache"] >= 512
    second = out["second_corpus"]  # a project the pair was not tuned on: lib2to3
    assert second["corpus"] == "heldout" and second["points"] == 2 and second["lossless"] is True
    assert second["tokens_per_target_forward"] >= 1.0 and second["time_split_s"]["spec"]["verify_s"] > 0


def test_complete_into_a_closed_pipe_exits_quietly():
    # `codespec-lsp complete ... | head`: the reader may leave before the answer is written;
    # `true` leaves at once, so the write always meets a closed pipe.
    import subprocess
    import sys
    proc = subprocess.run(
        f"{sys.executable} -m codespec_lsp.cli complete {DEMO} --line 12 --col 0 --json "
        f"--preset tiny --device cpu | true", shell=True, capture_output=True, text=True,
        timeout=300, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin",
                          "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr


def test_cancel_trials_land_in_decoding_not_in_a_cold_prefill(monkeypatch):
    """Every trial's prompt is already cached under its own document (the cache keeps one entry per
    document: a shared key made every trial prefill ~1,000 tokens cold, and the cancel waited there)."""
    from codespec_lsp.bench.engine import cancel_latencies, completion_points, corpus_files
    engine = load_engine(preset="tiny", device="cpu")
    prompts = completion_points(corpus_files(None), 3, engine)
    results, generate = [], engine.generate
    monkeypatch.setattr(engine, "generate", lambda ids, **kw: (
        results.append((len(ids), generate(ids, **kw))) or results[-1][1]))
    assert len(cancel_latencies(engine, prompts, trials=3)) == 3
    assert len(results) == 3
    for n, gen in results:
        assert gen.result.cancelled and n - gen.result.reused_tokens <= 2
